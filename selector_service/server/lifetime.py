"""Child processes of the service never outlive the `selector-service serve` process that started them.

A `kill -9` of `serve` runs none of its clean-up, so each child asks the kernel for a signal when its
parent dies (Linux `prctl(PR_SET_PDEATHSIG)`): the embedded Valkey (selector_service/server/embedded.py) and
every worker of `serve --workers N` (`worker_app` in selector_service/server/app.py, the app factory the
workers load). Without it an orphaned worker would keep the port (a restart fails with "Address already
in use") and answer 503 on every data call, its store gone with the parent.

The kernel sends the signal when the *thread* that started the child exits: serve starts its children
from its main thread, whose end is the end of the process.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
#: The exit status of a worker that found its parent already gone at start-up.
EXIT_ORPHANED = 4


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies. False where that cannot be
    asked (not Linux); the caller then checks on its parent some other way or not at all."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    return True
