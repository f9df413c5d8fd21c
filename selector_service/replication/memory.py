"""Memory admission: how much memory one service process may spend on datasets, and what a dataset costs.

A dataset is held whole in every process that serves it (core/beliefs.py: 52 bytes per prompt plus 65
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

import contextlib
import math
import os
import resource
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from selector_service.core.beliefs import _INITIAL_CAPACITY, FIELDS, OBSERVED_FIELDS
from selector_service.errors import InsufficientMemory

if TYPE_CHECKING:
    from selector_service.dataset.state import DatasetSpec, DatasetState

__all__ = [
    "BUDGET_SHARE",
    "Admit",
    "MemoryLedger",
    "admission_bytes",
    "default_budget",
    "machine_memory",
    "observed_rows",
]

#: Why a dataset comes into the process: the words of a refusal say what became of it.
Action = Literal["create", "import", "load"]
#: What a snapshot decoder calls with the spec and array layout it read, before it allocates anything.
Admit = Callable[["DatasetSpec", list[Any]], None]

#: Share of the process's memory the default budget gives to datasets; the rest is the interpreter, numba,
#: request bodies and the kernels' temporaries.
BUDGET_SHARE = 0.75
_PER_PROMPT = sum(dt.itemsize * math.prod(shape) for dt, shape in FIELDS.values())  # 52
_PER_OBSERVED = sum(dt.itemsize * math.prod(shape) for dt, shape in OBSERVED_FIELDS.values())  # 65
_CGROUP_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def admission_bytes(size: int, observed_rows: int) -> int:
    """What a dataset of `size` prompts with room for `observed_rows` observed prompts is charged when
    it comes into the process: its arrays (52 B/prompt + 65 per observed row) twice, live and the copy a
    snapshot takes."""
    return 2 * (_PER_PROMPT * size + _PER_OBSERVED * observed_rows)


def observed_rows(size: int, layout: list[Any]) -> int:
    """Rows of the observed set a snapshot's layout declares (a fresh dataset's first capacity when it
    declares none; a version 1 snapshot, converted on load, at most every prompt)."""
    for name, _dtype, shape in layout:
        if name == "obs_ids":
            return int(shape[0])
    if any(name == "hmm_d" for name, _, _ in layout):
        return size
    return min(size, _INITIAL_CAPACITY)


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


class MemoryLedger:
    """What one process charges against its memory budget: every dataset it holds (`held`, shared with
    its owner), every one allocated and not installed yet (`incoming`), every admission not allocated
    yet. Admission runs on the event loop and in decoding threads, under one lock."""

    def __init__(self, budget: int, held: Mapping[str, DatasetState]) -> None:
        self.budget = budget
        self.held = held
        self.incoming: dict[str, DatasetState] = {}  # allocated by a catch-up, not installed yet
        self._reserved: dict[object, tuple[str, int]] = {}  # admitted, not allocated yet
        self._lock = threading.Lock()

    def charged(self, replacing: str | None = None) -> int:
        """Bytes charged now: every dataset held (but `replacing`'s, about to be replaced), every one
        allocated and not installed yet, every admission not allocated yet."""
        states = [s for n, s in list(self.held.items()) if n != replacing]
        states += list(self.incoming.values())
        return sum(s.memory_bytes() for s in states) + sum(b for _, b in list(self._reserved.values()))

    def admit(self, name: str, nbytes: int, action: Action, replacing: str | None = None) -> object:
        """Reserves `nbytes` for dataset `name` (InsufficientMemory when they do not fit in the budget);
        returns the token `unreserve` takes once the dataset is allocated and counted, or given up."""
        with self._lock:
            held = self.charged(replacing)
            if held + nbytes > self.budget:
                raise self._no_room(name, nbytes, held, action)
            token = object()
            self._reserved[token] = (name, nbytes)
            return token

    def unreserve(self, token: object) -> None:
        with self._lock:
            self._reserved.pop(token, None)

    @contextlib.contextmanager
    def admitting(self, name: str, action: Action, replacing: str | None = None) -> Iterator[Admit]:
        """An `admit(spec, layout)` for a snapshot decoder (or a fresh dataset: layout []), which admits
        the dataset it is about to allocate; its reservations are given back when the block ends (the
        dataset is counted by then, or given up)."""
        tokens: list[object] = []

        def admit(spec: DatasetSpec, layout: list[Any]) -> None:
            need = admission_bytes(spec.size, observed_rows(spec.size, layout))
            tokens.append(self.admit(name, need, action, replacing))

        try:
            yield admit
        finally:
            for token in tokens:
                self.unreserve(token)

    def _no_room(self, name: str, nbytes: int, held: int, action: Action) -> InsufficientMemory:
        after = {
            "create": "nothing was created",
            "import": "nothing was imported",
            "load": "it stays intact in the store; serve it from a replica with room for it",
        }[action]
        return InsufficientMemory(
            f"dataset {name!r} needs about {human(nbytes)} of memory in this process (52 bytes per prompt "
            f"plus 65 per observed prompt, twice: live and a snapshot's copy) and the datasets it holds "
            f"already take {human(held)} of its {human(self.budget)} memory budget "
            f"(SELECTOR_MEMORY_BUDGET_BYTES); {after}. Delete datasets no longer needed, or give the "
            "service more memory and a larger SELECTOR_MEMORY_BUDGET_BYTES"
        )

    def out_of_memory(self, name: str, action: Action) -> InsufficientMemory:
        """What an allocation that failed (MemoryError) for dataset `name` answers."""
        done = {
            "create": "nothing was created",
            "import": "nothing was imported",
            "load": "the store keeps it",
        }
        return InsufficientMemory(
            f"the process ran out of memory allocating dataset {name!r} ({done[action]}): its memory "
            f"budget ({human(self.budget)}, SELECTOR_MEMORY_BUDGET_BYTES) is larger than what the "
            "machine or its limits (ulimit, cgroup) allow; lower it"
        )
