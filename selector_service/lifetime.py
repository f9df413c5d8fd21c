"""Child processes of the service never outlive the `selector-service serve` process that started them.

A `kill -9` of `serve` runs none of its clean-up, so each child asks the kernel for a signal when its
parent dies (Linux `prctl(PR_SET_PDEATHSIG)`): the embedded Valkey (selector_service/embedded.py) and
every worker of `serve --workers N` (`worker_app` below, the app factory the workers load). Without it
an orphaned worker would keep the port (a restart fails with "Address already in use") and answer 503
on every data call, its store gone with the parent.

The kernel sends the signal when the *thread* that started the child exits: serve starts its children
from its main thread, whose end is the end of the process.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

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


def worker_app() -> FastAPI:
    """The app factory of a `serve --workers N` worker (a multiprocessing child of serve).

    It asks for SIGTERM when serve dies (the worker then shuts down like on any SIGTERM), then checks
    that serve is still its parent: one killed before the request took effect has left the worker to
    init, and no signal will ever come, so the worker exits at once. Settings come from the environment
    serve prepared."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        die_with_parent(signal.SIGTERM)
        if os.getppid() != parent.pid:
            os._exit(EXIT_ORPHANED)  # nothing started yet; serve is gone, with whoever reads our output
    from selector_service.app import create_app

    return create_app()
