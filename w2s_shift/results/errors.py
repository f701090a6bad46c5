"""The error of every reader and writer of a run directory."""


class RunDirError(RuntimeError):
    """The run directory cannot be used: not a (finished) run, a cell directory given for the run, a damaged or
    changed file (named with its field), unwritable, or holding a run of a different config."""
