"""Errors a user can act on, each with its documented exit code.

The CLI prints `ecotrain: error: <message>` and exits with `exit_code`; no traceback.
"""

# Exit codes (documented in README "Exit codes").
EXIT_OK = 0
EXIT_FAILURE = 1  # an unexpected error (a bug): traceback shown
EXIT_USAGE = 2  # bad config, bad data, bad command line
EXIT_CHECKPOINT = 3  # a checkpoint could not be written or read
EXIT_DIVERGED = 4  # loss became NaN/Inf and the guard stopped the run
EXIT_PREEMPTED = 75  # SIGTERM/SIGINT: checkpoint written, run can be resumed (EX_TEMPFAIL)


class EcotrainError(Exception):
    """An error with a one-line message meant for the user."""

    exit_code = EXIT_FAILURE


class ConfigError(EcotrainError):
    exit_code = EXIT_USAGE


class DataError(EcotrainError):
    exit_code = EXIT_USAGE


class CheckpointError(EcotrainError):
    exit_code = EXIT_CHECKPOINT


class PreemptedError(EcotrainError):
    """A stop signal before training began: nothing to checkpoint, the job can simply be restarted."""

    exit_code = EXIT_PREEMPTED
