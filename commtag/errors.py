"""The one root of every error commtag raises on purpose."""

from __future__ import annotations


class CommtagError(Exception):
    """Bad input, or an output commtag cannot write: the message names the file and the problem.

    The command line prints it as one line and exits 2, with no traceback;
    anything else that escapes is a bug in commtag and keeps its traceback.
    """

    #: The command line's exit status when this error stops a command.
    exit_code: int = 2

    def told(self) -> list[CommtagError]:
        """The errors the user is told of, each as one line: this one (none where another
        process of the same command tells them)."""
        return [self]
