"""The `qkvqa` command line: one module per command, discovered by `qkvqa.cli.main`."""
