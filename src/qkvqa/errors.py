"""Error types whose message tells the user what is wrong and how to fix it."""

from __future__ import annotations


class QkvqaError(Exception):
    """Base class: the CLI prints these as one line, without a traceback."""


class ConfigError(QkvqaError, ValueError):
    """A config key, value or file is wrong; the message names the key and the fix."""


class DataError(QkvqaError, ValueError):
    """An input file is malformed; the message names the file, the line and the field."""


class MissingWeightsError(QkvqaError, FileNotFoundError):
    """Model weights are not on disk; the message says where to put them."""


class StaleArtifactError(QkvqaError, RuntimeError):
    """An index, cache or run record does not match the data or config it is used with."""


# The exit code of a run stopped by a signal (SIGTERM, SIGUSR1, SLURM preemption) after it saved its checkpoint:
# 128 + SIGTERM, the shell's convention, so `train && evaluate` does not go on with a half-trained model and a SLURM
# script can requeue on it (docs/training.md).
EXIT_INTERRUPTED = 143
EXIT_CTRL_C = 130  # the same stop on Ctrl-C (SIGINT): 128 + SIGINT
EXIT_HANGUP = 129  # the same stop on SIGHUP (the terminal closed): 128 + SIGHUP


class RunInterrupted(QkvqaError):
    """A run stopped on a signal after saving its state; `resume=auto` continues it. Exits with EXIT_INTERRUPTED."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str = "", signum: "int | None" = None):
        import signal

        super().__init__(message)
        self.signum = signum  # the signal that stopped the run (SIGUSR1 requeues a SLURM job)
        if signum == signal.SIGINT:  # Ctrl-C: 128 + SIGINT, as a shell reports it
            self.exit_code = EXIT_CTRL_C
        elif signum == signal.SIGHUP:  # the terminal closed: 128 + SIGHUP, saved and resumable all the same
            self.exit_code = EXIT_HANGUP
