"""Running numba `parallel=True` kernels safely from many threads.

numba's default `workqueue` threading layer is not thread-safe: two Python threads that launch parallel
kernels at the same time make the process abort ("Terminating: Nested parallel kernel launch
detected"). The service calls kernels from a thread pool, so every wrapper in this package launches its
parallel kernel while holding `PARALLEL_LOCK` (ours). A parallel kernel already uses every core, so
serialising launches costs little; serial kernels (small inputs) never take the lock.

We do not switch numba's threading layer instead: that setting is process-wide, must happen before the
first launch, and the `omp` layer with GNU OpenMP is not fork-safe (`tbb` is not installed here).

Other code in the process that launches its own parallel numba kernels should hold the same lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["CHUNK", "PARALLEL_LOCK", "PARALLEL_MIN", "launch"]

#: Held while any parallel kernel of this package runs.
PARALLEL_LOCK = threading.Lock()

#: Inputs smaller than this run in the serial twin of a kernel: no thread-pool launch, no lock.
PARALLEL_MIN = 32_768

#: Prompts per work item inside parallel kernels (per-item scratch buffers are allocated once per chunk).
CHUNK = 2_048


def launch(
    serial: Callable[..., Any],
    parallel: Callable[..., Any],
    rows: int,
    *args: Any,
    threshold: int = PARALLEL_MIN,
) -> Any:
    """Runs a kernel over `rows` rows: ``serial(*args)`` below `threshold` (no thread pool, no lock), else
    ``parallel(*args)`` while holding `PARALLEL_LOCK`. Callers pass their module's threshold so that a
    test can lower it there."""
    if rows < threshold:
        return serial(*args)
    with PARALLEL_LOCK:
        return parallel(*args)
