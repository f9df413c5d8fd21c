"""Memory admission: how much memory one service process may spend on datasets, and what a dataset costs.

A dataset is held whole in every process that serves it (core/beliefs.py: 43 bytes per prompt plus 65
per observed prompt). The engine charges each dataset it holds `DatasetState.memory_bytes()`: its live
arrays, the same again for the copy a snapshot or an export takes while the live state moves on, and
the whole-dataset score caches it has built. A dataset coming into the process (created, imported, or
loaded from the store because a request names it) is charged `admission_bytes` before anything of it is
allocated, and refused with 507 when the charges would pass the budget.

The budget (`SELECTOR_MEMORY_BUDGET_BYTES`, 0 = automatic) defaults to 75% of the memory this process
can have: the smaller of the machine's physical memory and the cgroup limit of its container (v2
`memory.max`, v1 `memory.limit_in_bytes`), split between the `--workers` (each holds its own copy of
every dataset it serves), and within what an address-space limit (`ulimit -v`) leaves.
"""

from __future__ import annotations

import math
import os
import resource
from pathlib import Path

from selector_service.core.beliefs import FIELDS, OBSERVED_FIELDS

__all__ = ["BUDGET_SHARE", "admission_bytes", "default_budget", "machine_memory"]

#: Share of the process's memory the default budget gives to datasets; the rest is the interpreter, numba,
#: request bodies and the kernels' temporaries.
BUDGET_SHARE = 0.75
_PER_PROMPT = sum(dt.itemsize * math.prod(shape) for dt, shape in FIELDS.values())  # 43
_PER_OBSERVED = sum(dt.itemsize * math.prod(shape) for dt, shape in OBSERVED_FIELDS.values())  # 65
_CGROUP_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def admission_bytes(size: int, observed_rows: int) -> int:
    """What a dataset of `size` prompts with room for `observed_rows` observed prompts is charged when
    it comes into the process: its arrays (43 B/prompt + 65 per observed row) twice, live and the copy a
    snapshot takes."""
    return 2 * (_PER_PROMPT * size + _PER_OBSERVED * observed_rows)


def _cgroup_limit() -> int | None:
    for path in _CGROUP_FILES:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # v1 says "no limit" with a huge number, v2 with "max"
            return int(text)
    return None


def machine_memory() -> int:
    """Bytes of memory this process can have: physical memory, or the container's cgroup limit when
    that is lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit()
    return min(physical, limit) if limit else physical


def _address_space_left() -> int | None:
    """Bytes of address space left under RLIMIT_AS (`ulimit -v`), None when there is no such limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as status:
            used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        used = 0
    return max(soft - used, 0)


def default_budget(workers: int = 1) -> int:
    """The automatic budget of one process (see the module docstring)."""
    budget = BUDGET_SHARE * machine_memory() / max(workers, 1)
    left = _address_space_left()
    if left is not None:
        budget = min(budget, BUDGET_SHARE * left)
    return int(budget)


def human(nbytes: float) -> str:
    """`nbytes` in the unit people read it in (1.5 GiB, 340 MiB, 12 KiB)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} B"
