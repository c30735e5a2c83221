"""Compare runs: one table schema from local run records or the W&B API, as Markdown/CSV and plots."""
