"""Runs: identity and directory, the on-disk run record, resume, seeding, the Lightning job wrapper."""
