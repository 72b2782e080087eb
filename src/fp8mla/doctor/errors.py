"""The one exception the doctor raises for input it cannot analyse."""

from __future__ import annotations


class TraceError(ValueError):
    """A trace file that is missing, unreadable, empty, or not a Chrome trace.

    The message is one line, meant to be shown to the user as is (the CLI prints it to stderr
    and exits with status 2).
    """


class DamagedTrace(TraceError):
    """A trace whose file is damaged (truncated, corrupt gzip data, invalid JSON) after some
    complete events: analysing only those would give totals that look whole.

    ``diagnose(..., allow_partial=True)`` analyses them instead and marks the report partial.
    """
