"""User-facing errors: the CLI prints their message as one line and exits non-zero."""


class VitposError(Exception):
    """A problem with the user's input or environment; the message names the problem and the fix."""


class OutputBusyError(VitposError):
    """The output folder is being written by another process: the refused command must leave
    everything there alone (no clean-up of files it did not write)."""
