"""A store lost while the service starts: exit status 2 and one line that says why (docs/api.md).

`selector-service serve` checks its store before it starts the app; the store can still die or freeze
in the moment between that check and the app's own connection (the app's lifespan). uvicorn would then
log the lifespan's traceback, "Application startup failed" and exit with status 3, which means a bad
setting. Instead the lifespan calls `store_lost`, which quiets those records of uvicorn's logger and
writes the reason to the report file serve named in REPORT_ENV (a worker of `--workers N` is another
process); serve reads it once uvicorn has stopped, prints it as one line and exits with status 2.
"""

from __future__ import annotations

import contextlib
import logging
import os

#: The file (set by serve for the app and its workers) where a start-up that lost its store says why.
#: Not a SELECTOR_ setting: nothing a user sets.
REPORT_ENV = "RLVR_SELECTOR_STARTUP_REPORT"

# What uvicorn logs about a failed start-up, in the app's process (the lifespan's traceback, then the
# verdict) and in the supervisor of `--workers N`.
_UVICORN_NOISE = (
    "Traceback (most recent call last)",
    "Application startup failed",
    "failed to start, stopping",
)


class StoreLostAtStartup(Exception):
    """The store answered serve's check, then could not be reached by the app starting up."""


def redact(url: str) -> str:
    """The store URL without its credentials."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"


def store_lost(url: str, exc: BaseException) -> StoreLostAtStartup:
    """Records why the start-up failed (the report file, if serve set one) and quiets uvicorn's own
    account of it in this process; returns the exception for the lifespan to raise."""
    reason = f"lost the store at {redact(url)} while starting ({type(exc).__name__}: {exc})"
    logging.getLogger("uvicorn.error").addFilter(_quiet)
    path = os.environ.get(REPORT_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
            f.write(reason.replace("\n", " ") + "\n")
    return StoreLostAtStartup(reason)


def _quiet(record: logging.LogRecord) -> bool:
    return not any(noise in record.getMessage() for noise in _UVICORN_NOISE)


def reported(path: str) -> str | None:
    """The first reason written to the report file `path`, if any."""
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline().strip()
    except OSError:
        return None
    return line or None


class QuietWhenReported(logging.Filter):
    """For serve's own uvicorn logger: drops the supervisor's "failed to start" once a worker reported
    a lost store (serve says it in its one line)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def filter(self, record: logging.LogRecord) -> bool:
        return _quiet(record) or reported(self.path) is None
