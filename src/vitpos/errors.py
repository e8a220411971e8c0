"""User-facing errors: the CLI prints their message as one line and exits non-zero."""


class VitposError(Exception):
    """A problem with the user's input or environment; the message names the problem and the fix."""
