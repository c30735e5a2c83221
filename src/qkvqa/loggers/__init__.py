"""Loggers: the local run-record logger and the W&B logger factory."""
