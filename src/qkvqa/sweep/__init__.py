"""Sweeps in the W&B sweep format: an offline subprocess runner (default) and a `wandb agent` backend."""
