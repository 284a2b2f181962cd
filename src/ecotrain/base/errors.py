"""Errors a user can act on, each with its documented exit code.

The CLI prints `ecotrain: error: <message>` and exits with `exit_code`; no traceback.
"""

# Exit codes (documented in docs/cli.md, "Exit codes").
EXIT_OK = 0
EXIT_FAILURE = 1  # an unexpected error (a bug, or user code failing): one line; traceback in error.log, --debug
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


# errno -> what to do about it; the one table every command's file errors are said with
_OS_ADVICE = {
    "ENAMETOOLONG": "the name is too long for the file system (255 bytes a name): choose a shorter one",
    "EFBIG": "the file would exceed the file-size limit (ulimit -f): raise the limit or write elsewhere",
    "ENOSPC": "the disk is full: free space or write elsewhere",
    "EDQUOT": "the disk quota is used up: free space or write elsewhere",
    "ENOTDIR": "a part of the path is a file, not a folder: choose another path",
    "EISDIR": "it is a folder: give a file name",
    "EACCES": "permission denied: choose a folder you may write",
    "EPERM": "not permitted: choose a folder you may write",
    "EROFS": "the file system is read-only: write elsewhere",
    "ELOOP": "too many symbolic links (a loop?): fix the links or choose another path",
    "ENOENT": "its folder does not exist: create it or choose another path",
    "EEXIST": "it exists and cannot be replaced: remove it or choose another path",
}


def os_advice(errno_value: int | None) -> str | None:
    """What to do about an errno (ENOSPC: free space or write elsewhere), or None."""
    import errno as _errno

    return _OS_ADVICE.get(_errno.errorcode.get(errno_value or 0, ""))


def os_error_line(exc: OSError, path=None) -> str:
    """One line for an OSError: where, what went wrong, what to do."""
    where = path if path is not None else (exc.filename if exc.filename is not None else "a file")
    what = exc.strerror or str(exc)
    advice = os_advice(exc.errno)
    return f"{where}: {what}" + (f"; {advice}" if advice else "")
