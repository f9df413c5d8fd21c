"""Scale figures: a DPS step at 10^5..10^8 prompts in-process, a 10^7-prompt dataset in the real service,
and the dictionary-based reference sampler in the same process.

    python bench/bench_scale.py [--sizes 1e5,1e6,1e7,1e8] [--reference-sizes 1e5,1e6] [--service-n 1e7]

Three parts, each optional:

1. In-process kernels (selector_service.core), at every size of --sizes, in two regimes side by side:
   "sparse" (--observed prompts ever observed, default 10^5: a step observes B of them) and "full"
   (every prompt observed, the worst case). Per regime: close_step (the DPS update of the observed set,
   hmm_decay 0.7) after observing a batch, a DPS select over the whole dataset (METHODS 2) and an
   INSIGHT select with its default candidate pool, each the median of --repeats calls after a warm-up.
   A "step" is close + DPS select. Next to each time: in the sparse regime the time of np.argpartition
   over --observed floats, timed right after every step (the step should cost a few of those, whatever
   N); in the full regime the memory-bandwidth floor of the arrays the pass must touch (close: 121 bytes
   per prompt read + written, dps.py; select: the 12-byte prior row of every prompt) at the stream
   bandwidth of a large numpy copy measured in the same run. Both ratios are also taken in CPU seconds
   of the one-thread steps (the table shows those): on a shared machine wall-clock ratios include time
   the process did not run at all. Memory: the belief arrays' bytes per prompt (exact,
   capacity included) and the resident memory per prompt (RSS growth when the beliefs are built; peak RSS
   via VmHWM), and bytes per prompt at 1%, 10% and 100% observed. 10^8 runs in a regime only when more
   than --min-free-gb of memory is available (the full regime's arrays alone are 9 GB); otherwise it is
   projected from the largest measured size (sparse: the measured 10^7 step, the step does not depend on
   N; full: linearly in N, the passes are streams over the arrays) and labelled so. When 10^8 is
   measured, the projection is still printed next to it, as a check of the basis.
2. The reference sampler (bench/reference_dps_sampler.py, the DPS authors' dictionary design) at
   --reference-sizes: its step close (`train`, a Python loop over every prompt) and its select over the
   whole dataset, and the speed-up of the kernels at the same size. Its cost at larger sizes is
   projected linearly (per-prompt cost of the largest measured size).
3. The service (a real `selector-service` subprocess on a private Redis server) at --service-n prompts:
   after a warm-up on a small dataset (so the idle RSS includes every loaded kernel): the time to create
   the dataset and the RSS of the service process per prompt; then the dataset is replaced by an import
   of long-run beliefs (every prompt observed, all values distinct: snapshots compress as badly as real
   ones and priors do not tie) and the figures are taken on it: /observe, /select DPS that closes a
   step, /select DPS and INSIGHT at an open step; the first snapshot (SELECTOR_SNAPSHOT_EVERY_RECORDS is
   set so one is due after ~20 steps, when REPLAY_BUDGET also asks for one at 10^7) with /select
   latency while it is written and its chunking in Redis; then --replay-steps more steps (the most a
   restart can have to replay before the next snapshot is due), kill -9, start a new process, and the
   time until its first /select answers (snapshot load + log replay), checking that it returns the
   same batch as the killed process did.

Prints tables and one JSON line last; writes bench/out/scale.json and bench/out/scale.png (time per step
vs prompts, both regimes). The default run takes ~10 minutes on 2 cores and peaks at ~12 GB when the
full regime is measured at 10^8.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import numba
import numpy as np
import psutil
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.reference_dps_sampler import DictHMMSampler
from selector_service.core import BeliefArrays, apply_results, close_step, strategies
from selector_service.engine import REPLAY_BUDGET
from selector_service.snapshot import serialize_snapshot
from selector_service.state import DatasetSpec, DatasetState
from selector_service.store import Keys
from tests.utils import RedisServer, ServiceProcess

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "bench" / "out"
HMM_DECAY = 0.7
#: Bytes close_step moves per prompt (dps.py): reads D (36) + prior (12) + prev (12) + step_state (1),
#: writes D, prior, prev (60).
CLOSE_BYTES = 61 + 60
#: Bytes a whole-dataset DPS select must read per prompt at least: the float32[3] prior row.
SELECT_BYTES = 12
#: What the DPS authors report for their implementation at 10^7 prompts (METHODS 5).
PAPER_STEP_S_1E7 = 2.4
PAPER_GIB_1E7 = 0.9
#: Memory the service part needs per prompt at its peak, all processes together (measured ~650 B).
SERVICE_BYTES_PER_PROMPT = 700
TARGETS = {"bytes_per_prompt": 128, "service_step_s_1e7": 1.0, "restart_s": 30.0}


# ---- small utilities ------------------------------------------------------------------------------
def parse_sizes(text: str) -> list[int]:
    """'1e5,1e6' -> [100000, 1000000]; empty -> []."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        if part:
            value = float(part)
            if value < 1 or value != int(value):
                raise argparse.ArgumentTypeError(f"sizes must be whole numbers >= 1, got {part!r}")
            sizes.append(int(value))
    return sorted(set(sizes))


def fmt_n(n: int) -> str:
    exp = math.log10(n)
    return f"1e{int(exp)}" if exp == int(exp) else f"{n:,}"


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(xs), q)) if xs else None


def proc_status_bytes(pid: int, field: str) -> int | None:
    """A memory field of /proc/<pid>/status (VmRSS, VmHWM = peak RSS) in bytes; None off Linux."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak_rss(pid: int) -> bool:
    """Resets VmHWM of a process we own to its current RSS (Linux: write 5 to clear_refs)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def stream_bandwidth(nbytes: int = 1 << 29, repeats: int = 5, clock=time.perf_counter) -> float:
    """Bytes read + written per second by np.copyto over a large array (one thread); per CPU second
    with clock=time.process_time (what a shared machine distorts least)."""
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    samples = []
    for _ in range(repeats):
        t = clock()
        np.copyto(dst, src)
        samples.append(clock() - t)
    return 2 * src.nbytes / statistics.median(samples)


def random_outcomes(rng: np.random.Generator, n: int, batch: int, k: int = 8):
    """`batch` distinct prompt ids with random states and matching success counts out of k."""
    ids = rng.choice(n, size=batch, replace=False).astype(np.int64)
    states = rng.integers(1, 4, size=batch).astype(np.int8)
    successes = np.where(states == 1, 0.0, np.where(states == 3, float(k), float(k // 2)))
    return ids, successes, np.full(batch, float(k)), states


# ---- 1. in-process kernels ------------------------------------------------------------------------
def full_beliefs(n: int, seed: int = 5) -> BeliefArrays:
    """Beliefs of a long-running dataset in which every prompt has been observed: all values distinct
    (float32 mantissas are effectively random, so snapshots compress about as badly as real ones and
    priors do not tie). Built slice by slice, so the temporaries stay small at 10^8."""
    rng = np.random.default_rng(seed)
    ids = np.arange(n, dtype=np.int32)
    ba = BeliefArrays.new(n)
    ba.reserve(n)
    step = 1 << 22
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        m = hi - lo
        ba.alpha[lo:hi] = 1.0 + 30.0 * rng.random(size=m)
        ba.beta[lo:hi] = 1.0 + 30.0 * rng.random(size=m)
        ba.obs_d[lo:hi] = 0.3 + 3.0 * rng.random(size=(m, 9), dtype=np.float32)
        for arr in (ba.obs_prior, ba.obs_prev):
            part = 0.05 + rng.random(size=(m, 3), dtype=np.float32)
            arr[lo:hi] = part / part.sum(axis=1, keepdims=True)
        ba.last_state[lo:hi] = rng.integers(1, 4, size=m, dtype=np.int8)
        ba.n_obs[lo:hi] = rng.integers(1, 40, size=m, dtype=np.int32)
    ba.hmm_slot[:] = ids
    ba.obs_ids[:] = ids
    ba.observed = n
    return ba


def sparse_beliefs(n: int, observed: int, seed: int = 6) -> tuple[BeliefArrays, np.ndarray]:
    """n prompts of which `observed` (random ids) have been observed over a few steps; returns the
    beliefs and the observed ids (the pool later steps observe from)."""
    rng = np.random.default_rng(seed)
    ba = BeliefArrays.new(n)
    for arr in (ba.last_state, ba.n_obs):  # np.zeros pages are lazy: touch them
        arr.fill(0)
    pool = rng.choice(n, size=observed, replace=False).astype(np.int64)
    for part in np.array_split(pool, 4):
        states = rng.integers(1, 4, size=part.size).astype(np.int8)
        successes = np.where(states == 1, 0.0, np.where(states == 3, 8.0, 4.0))
        apply_results(ba, part, successes, np.full(part.size, 8.0), states, 1.0, 1.0, 1.0)
        close_step(ba, HMM_DECAY)
    return ba, pool


def kernel_figures(
    n: int,
    regime: str,
    batch: int,
    repeats: int,
    bandwidth: float,
    observed: int,
    cpu_bandwidth: float,
    seed: int = 0,
) -> dict[str, Any]:
    """close_step, DPS select and INSIGHT select over n prompts in `regime` ("sparse": `observed`
    prompts ever observed; "full": all of them); memory per prompt."""
    pid = os.getpid()
    rng = np.random.default_rng(seed)
    gc.collect()
    base = rss(pid)
    reset_peak_rss(pid)
    t0 = time.perf_counter()
    if regime == "full":
        ba, pool = full_beliefs(n), None
    else:
        ba, pool = sparse_beliefs(n, min(observed, n))
    build_s = time.perf_counter() - t0
    resident = rss(pid) - base
    kw = dict(batch_size=batch, seed=0, key="scale", dataset_k=8)

    def observe_batch():
        ids = rng.choice(pool, size=batch, replace=False) if pool is not None else None
        if ids is None:
            ids = random_outcomes(rng, n, batch)[0]
        states = rng.integers(1, 4, size=batch).astype(np.int8)
        successes = np.where(states == 1, 0.0, np.where(states == 3, 8.0, 4.0))
        apply_results(ba, ids, successes, np.full(batch, 8.0), states, 1.0, 1.0, 1.0)

    cpu_close, cpu_dps, arg_wall, arg_cpu = [], [], [], []
    yardstick = np.random.default_rng(0).random(min(observed, n)) if regime == "sparse" else None

    def argpartition_now() -> None:
        """np.argpartition over `observed` floats, timed right after each step (same load)."""
        k = max(0, yardstick.size - batch)
        t, c = time.perf_counter(), time.process_time()
        np.argpartition(yardstick, k)
        arg_wall.append(time.perf_counter() - t)
        arg_cpu.append(time.process_time() - c)

    def steps(count: int, first_step: int, insight: bool):
        closes, dps, ins = [], [], []
        for step in range(first_step, first_step + count + 1):  # the first one warms up
            observe_batch()
            t, c = time.perf_counter(), time.process_time()
            close_step(ba, HMM_DECAY)
            t_close, c_close = time.perf_counter() - t, time.process_time() - c
            t, c = time.perf_counter(), time.process_time()
            strategies.select(ba, strategy="dps", params=None, step=step + 1, **kw)
            t_dps, c_dps = time.perf_counter() - t, time.process_time() - c
            if step > first_step and not insight:  # one thread: CPU seconds are comparable to the copy's
                cpu_close.append(c_close)
                cpu_dps.append(c_dps)
            if step > first_step and yardstick is not None:
                argpartition_now()
            t = time.perf_counter()
            if insight:
                strategies.select(ba, strategy="insight", params=None, step=step + 1, **kw)
            t_ins = time.perf_counter() - t
            if step > first_step:
                closes.append(t_close)
                dps.append(t_dps)
                ins.append(t_ins)
        return closes, dps, ins

    closes, dps, insight = steps(repeats, 0, True)
    peak = proc_status_bytes(pid, "VmHWM")
    # The same passes on one thread: on a small, busy machine the parallel launch can cost more than
    # it saves (each parallel region waits for every worker thread to be scheduled).
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        closes1, dps1, _ = steps(repeats, repeats + 1, False)
    finally:
        numba.set_num_threads(threads)
    m = ba.observed
    nbytes = ba.nbytes
    close_s, dps_s = statistics.median(closes), statistics.median(dps)
    row = {
        "n": n,
        "regime": regime,
        "observed": m,
        "build_s": build_s,
        "close_s": close_s,
        "select_dps_s": dps_s,
        "select_insight_s": statistics.median(insight),
        "step_s": close_s + dps_s,
        "close_s_max": max(closes),
        "select_dps_s_max": max(dps),
        "close_s_1thread": statistics.median(closes1),
        "select_dps_s_1thread": statistics.median(dps1),
        "step_s_1thread": statistics.median(closes1) + statistics.median(dps1),
        "array_bytes_per_prompt": nbytes / n,
        "rss_bytes_per_prompt": resident / n,
        "peak_bytes_per_prompt": (peak - base) / n if peak is not None else None,
        "repeats": repeats,
    }
    # Floors of the observed set's passes (the full regime: every prompt).
    close_floor, select_floor = CLOSE_BYTES * m / bandwidth, SELECT_BYTES * m / bandwidth
    row.update(
        close_floor_s=close_floor,
        select_dps_floor_s=select_floor,
        step_floor_s=close_floor + select_floor,
        close_x_floor=close_s / close_floor,
        select_dps_x_floor=dps_s / select_floor,
    )
    # The same in CPU seconds of the one-thread steps against the copy's CPU-second bandwidth: on a
    # shared machine the wall-clock ratios include time this process did not run at all.
    cpu_c, cpu_d = statistics.median(cpu_close), statistics.median(cpu_dps)
    row.update(
        close_cpu_s=cpu_c,
        select_dps_cpu_s=cpu_d,
        close_cpu_x_floor=cpu_c / (CLOSE_BYTES * m / cpu_bandwidth),
        select_dps_cpu_x_floor=cpu_d / (SELECT_BYTES * m / cpu_bandwidth),
    )
    if regime == "sparse":
        arg, arg_c = statistics.median(arg_wall), statistics.median(arg_cpu)
        row.update(
            argpartition_s=arg,
            step_x_argpartition=(close_s + dps_s) / arg,
            argpartition_cpu_s=arg_c,
            step_cpu_x_argpartition=(cpu_c + cpu_d) / arg_c,
        )
    return row


def memory_table(n: int) -> list[dict[str, Any]]:
    """Bytes per prompt of the belief arrays at 1%, 10% and 100% observed: the layout's formula and the
    arrays actually held (the observed set at its capacity) after observing that share at n prompts."""
    rows = []
    rng = np.random.default_rng(7)
    for share in (0.01, 0.10, 1.0):
        ba = BeliefArrays.new(n)
        ids = rng.permutation(n)[: int(share * n)]
        for part in np.array_split(ids, 8):  # the set grows as a run would, request by request
            apply_results(
                ba,
                part,
                np.zeros(part.size),
                np.full(part.size, 8.0),
                np.ones(part.size, np.int8),
                1.0,
                1.0,
                1.0,
            )
        rows.append(
            {
                "n": n,
                "observed_share": share,
                "formula_bytes_per_prompt": BeliefArrays.bytes_per_prompt(share),
                "held_bytes_per_prompt": ba.nbytes / n,
            }
        )
        del ba
        gc.collect()
    return rows


def print_kernels(rows: list[dict]) -> None:
    print(f"\nIn-process kernels (numba threads={numba.get_num_threads()}, cores={os.cpu_count()})")
    head = (
        f"{'N':>6} {'regime':>7} {'observed':>10} {'close ms':>9} {'DPS sel ms':>11} {'step ms':>9}"
        f" {'vs (in CPU seconds)':>18} {'1-thr ms':>9} {'INSIGHT ms':>11} {'B/p held':>9} {'RSS B/p':>8}"
    )
    print(head)
    for r in rows:
        if r["regime"] == "sparse":
            vs = f"{r['step_cpu_x_argpartition']:.1f}x argpart({r['observed']:,})"
        else:
            vs = f"{r['close_cpu_x_floor']:.2f}x / {r['select_dps_cpu_x_floor']:.2f}x floor"
        print(
            f"{fmt_n(r['n']):>6} {r['regime']:>7} {r['observed']:>10,} {r['close_s'] * 1e3:>9.2f}"
            f" {r['select_dps_s'] * 1e3:>11.2f} {r['step_s'] * 1e3:>9.2f} {vs:>18}"
            f" {r['step_s_1thread'] * 1e3:>9.2f} {r['select_insight_s'] * 1e3:>11.2f}"
            f" {r['array_bytes_per_prompt']:>9.1f} {r['rss_bytes_per_prompt']:>8.1f}"
        )


def project(rows: list[dict], n: int, regime: str) -> dict[str, Any]:
    """10^8 from the largest measured size below it in `regime`: the sparse step does not depend on N
    (only the observed set and B), so it is carried over; the full regime's passes stream over the
    arrays, so time and memory grow linearly in N."""
    basis = max((r for r in rows if r["n"] < n and r["regime"] == regime), key=lambda r: r["n"])
    scale = 1.0 if regime == "sparse" else n / basis["n"]
    out: dict[str, Any] = {"n": n, "regime": regime, "basis_n": basis["n"], "projected": True}
    for key in ("close_s", "select_dps_s", "step_s"):
        out[key] = basis[key] * scale
    out["array_bytes_per_prompt"] = (
        BeliefArrays.bytes_per_prompt(basis["observed"] / n)
        if regime == "sparse"
        else basis["array_bytes_per_prompt"]
    )
    out["array_gb"] = out["array_bytes_per_prompt"] * n / 1e9
    if regime == "sparse":
        out["basis"] = (
            f"the measured {fmt_n(basis['n'])} step, unchanged: close and DPS select walk only the "
            f"{basis['observed']:,} observed prompts and the batch; memory from the layout (25 B per prompt "
            "+ 65 B per observed prompt)"
        )
    else:
        out["basis"] = (
            f"per-prompt time and memory of the measured {fmt_n(basis['n'])} run times {fmt_n(n)}: the close "
            "and the DPS select are streaming passes over the belief arrays (memory-bound once they exceed "
            "the caches), so cost is linear in N"
        )
    return out


# ---- 2. reference sampler -------------------------------------------------------------------------
def reference_figures(n: int, batch: int, steps: int, seed: int = 0) -> dict[str, Any]:
    """The dictionary sampler's step close and whole-dataset select over n prompts."""
    pid = os.getpid()
    rng = np.random.default_rng(seed)
    gc.collect()
    base = rss(pid)
    sampler = DictHMMSampler(batch, HMM_DECAY)
    candidates = list(range(n))
    t = time.perf_counter()
    sampler.select(candidates)  # the first select creates every prompt's entries
    populate_s = time.perf_counter() - t
    trains, selects = [], []
    for _ in range(steps):
        ids = rng.choice(n, size=batch, replace=False).tolist()
        rates = (rng.integers(0, 9, size=batch) / 8.0).tolist()
        t = time.perf_counter()
        sampler.train(ids, rates)
        trains.append(time.perf_counter() - t)
        t = time.perf_counter()
        sampler.select(candidates)
        selects.append(time.perf_counter() - t)
    resident = rss(pid) - base  # the heap may reuse memory freed earlier: a lower bound
    del sampler, candidates
    gc.collect()
    train_s, select_s = statistics.median(trains), statistics.median(selects)
    return {
        "n": n,
        "populate_s": populate_s,
        "close_s": train_s,
        "select_dps_s": select_s,
        "step_s": train_s + select_s,
        "close_us_per_prompt": train_s / n * 1e6,
        "step_us_per_prompt": (train_s + select_s) / n * 1e6,
        "rss_bytes_per_prompt": resident / n,
        "traced_bytes_per_prompt": reference_bytes_per_prompt(min(n, 100_000), batch),
        "steps": steps,
    }


def reference_bytes_per_prompt(n: int, batch: int) -> float:
    """Bytes the reference holds per prompt after a step close, counted by tracemalloc (Python objects
    and numpy buffers; independent of what the heap had free before)."""
    rng = np.random.default_rng(1)
    candidates = list(range(n))
    gc.collect()
    tracemalloc.start()
    try:
        sampler = DictHMMSampler(batch, HMM_DECAY)
        sampler.select(candidates)
        sampler.train(rng.choice(n, size=batch, replace=False).tolist(), [0.5] * batch)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del sampler
    return held / n


def print_reference(rows: list[dict]) -> None:
    print("\nReference dictionary sampler vs kernels (same process, same N)")
    print(
        f"{'N':>6} {'ref close s':>12} {'us/prompt':>10} {'ref sel s':>10} {'ref B/p':>8}"
        f" {'x close':>9} {'x select':>9} {'x step':>9} {'x 1-thr':>9}"
    )
    for r in rows:
        print(
            f"{fmt_n(r['n']):>6} {r['close_s']:>12.3f} {r['close_us_per_prompt']:>10.1f}"
            f" {r['select_dps_s']:>10.3f} {r['traced_bytes_per_prompt']:>8.0f}"
            f" {r['speedup_close']:>9.0f} {r['speedup_select']:>9.0f} {r['speedup_step']:>9.0f}"
            f" {r['speedup_step_1thread']:>9.0f}"
        )


# ---- 3. the service -------------------------------------------------------------------------------
class SnapshotWatch:
    """Polls a dataset's snapshot lock key in a thread and records when it was held (perf_counter)."""

    def __init__(self, client: redis.Redis, lock_key: str, period_s: float = 0.005) -> None:
        self.client = client
        self.lock_key = lock_key
        self.period_s = period_s
        self.windows: list[list[float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        held = False
        while not self._stop.is_set():
            now = time.perf_counter()
            try:
                present = bool(self.client.exists(self.lock_key))
            except redis.RedisError:
                present = False
            if present and not held:
                self.windows.append([now, now])
            if present:
                self.windows[-1][1] = now
            held = present
            time.sleep(self.period_s)

    def start(self) -> SnapshotWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def holding(self) -> bool:
        return bool(self.client.exists(self.lock_key))


def random_beliefs(n: int, seed: int = 5) -> BeliefArrays:
    """Beliefs of a long-running dataset, every prompt observed (full_beliefs)."""
    return full_beliefs(n, seed)


def export_blob(name: str, n: int) -> bytes:
    """A dataset export (the /datasets/{name}/export format) holding `random_beliefs(n)`."""
    spec = DatasetSpec(name=name, size=n, hmm_decay=HMM_DECAY, uid="scale-import")
    state = DatasetState(spec, random_beliefs(n))
    return serialize_snapshot(state.snapshot_header(), state.arrays.arrays())


def service_figures(n: int, batch: int, replay_steps: int, redis_url: str | None) -> dict[str, Any]:
    """The issue's service checks at n prompts; see the module docstring (part 3)."""
    max_replay = max(1, math.ceil(REPLAY_BUDGET / n) - 1)  # closes * n must stay below REPLAY_BUDGET
    replay_steps = min(replay_steps, max_replay)
    # Each step appends 2 log records (observe, advance). The threshold lets the first snapshot come
    # after ~replay_steps + 1 steps and keeps the replay window free of a second one.
    records = 2 * replay_steps + 4
    env = {"SELECTOR_SNAPSHOT_EVERY_RECORDS": str(records), "SELECTOR_LOG_LEVEL": "info"}
    private = None if redis_url else RedisServer().start()
    url = redis_url or private.url
    prefix = f"scale{os.getpid()}"
    name = "scale"
    keys = Keys(prefix)
    client = redis.Redis.from_url(url)
    services: list[ServiceProcess] = []
    out: dict[str, Any] = {"n": n, "batch": batch, "snapshot_every_records": records}
    rng = np.random.default_rng(3)
    lat: dict[str, list[float]] = {"observe": [], "select_close": [], "select": [], "select_insight": []}
    watch = SnapshotWatch(client, keys.snaplock(name)).start()
    try:
        svc = ServiceProcess(redis_url=url, prefix=prefix, env=env).start()
        services.append(svc)
        pid = svc.proc.pid
        http = httpx.Client(base_url=svc.url, timeout=600)

        def post(path: str, body: dict, key: str | None = None, record: bool = False) -> httpx.Response:
            t0 = time.perf_counter()
            resp = http.post(path, json=body)
            dt = time.perf_counter() - t0
            resp.raise_for_status()
            if record and key:
                lat[key].append(dt)
            return resp

        def select_body(step: int, strategy: str = "dps", seed: int = 0, ds: str = name) -> dict:
            return {"dataset": ds, "step": step, "batch_size": batch, "strategy": strategy, "seed": seed}

        def observe_and_close(step: int, record: bool, ds: str = name, size: int = n) -> None:
            ids, succ, trials, _ = random_outcomes(rng, size, batch)
            results = [
                {"prompt_id": int(i), "successes": int(s), "trials": int(k)}
                for i, s, k in zip(ids, succ, trials, strict=True)
            ]
            body = {"dataset": ds, "step": step, "request_id": f"{ds}-s{step}", "results": results}
            post("/observe", body, "observe", record)
            post("/select", select_body(step + 1, ds=ds), "select_close", record)

        def open_selects(step: int, record: bool) -> None:
            post("/select", select_body(step), "select", record)
            post("/select", select_body(step, "insight"), "select_insight", record)

        # -- warm-up on a small dataset, so the idle RSS includes every loaded kernel ----------------
        warm, warm_n = "scale-warmup", max(2 * batch, 65_536)
        post("/datasets", {"name": warm, "size": warm_n, "hmm_decay": HMM_DECAY})
        for step in range(2):
            observe_and_close(step, False, ds=warm, size=warm_n)
            post("/select", select_body(step + 1, "insight", ds=warm))
        http.delete(f"/datasets/{warm}").raise_for_status()
        idle = rss(pid)
        out["rss_idle_mb"] = idle / 2**20

        # -- create (fresh priors), then replace by an import of long-run beliefs -------------------
        t = time.perf_counter()
        post("/datasets", {"name": name, "size": n, "hmm_decay": HMM_DECAY})
        out["create_s"] = time.perf_counter() - t
        out["rss_after_create_bytes_per_prompt"] = (rss(pid) - idle) / n
        http.delete(f"/datasets/{name}").raise_for_status()
        blob = export_blob(name, n)
        out["import_bytes"] = len(blob)
        t = time.perf_counter()
        http.post(f"/datasets/{name}/import", content=blob).raise_for_status()
        out["import_s"] = time.perf_counter() - t
        del blob
        gc.collect()
        reset_peak_rss(pid)  # the import's own transient copies are not what a running dataset costs
        out["rss_after_import_bytes_per_prompt"] = (rss(pid) - idle) / n
        snap0 = client.hget(keys.meta(name), "snap")

        # -- steps until the first snapshot starts ------------------------------------------------
        step = 0
        warmup = 1
        while True:
            observe_and_close(step, record=step >= warmup)
            step += 1
            if watch.windows or client.hget(keys.meta(name), "snap") != snap0:
                break
            open_selects(step, record=step > warmup)
            if step > records:
                raise RuntimeError(f"no snapshot started after {step} steps (threshold {records} records)")
        out["rss_steady_bytes_per_prompt"] = (rss(pid) - idle) / n
        out["rss_peak_before_snapshot_bytes_per_prompt"] = (proc_status_bytes(pid, "VmHWM") - idle) / n
        out["snapshot_triggered_at_step"] = step

        # -- /select while the snapshot is written ------------------------------------------------
        during: list[tuple[float, float]] = []
        deadline = time.perf_counter() + 300
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            post("/select", select_body(step))
            during.append((t0, time.perf_counter()))
            if not watch.holding() and client.hget(keys.meta(name), "snap") != snap0:
                break
        time.sleep(0.05)
        window = watch.windows[0] if watch.windows else None
        inside = [b - a for a, b in during if window and a <= window[1] and b >= window[0]]
        meta = {k.decode(): v.decode() for k, v in client.hgetall(keys.meta(name)).items()}
        chunk_sizes = [
            int(client.strlen(keys.snap_chunk(name, meta["snap"], i)))
            for i in range(int(meta["snap_chunks"]))
        ]
        out["snapshot"] = {
            "write_s": window[1] - window[0] if window else None,
            "chunks": len(chunk_sizes),
            "bytes": sum(chunk_sizes),
            "largest_chunk_bytes": max(chunk_sizes),
            "raw_bytes": n * BeliefArrays.new(1).nbytes_per_prompt,
            "covers_step": int(meta["snap_step"]),
            "selects_during": len(inside),
            "select_during_p50_ms": _ms(median(inside)),
            "select_during_max_ms": _ms(max(inside) if inside else None),
        }
        out["rss_peak_bytes_per_prompt"] = (proc_status_bytes(pid, "VmHWM") - idle) / n

        # -- more steps, then kill -9 and restart ---------------------------------------------------
        snap_step = int(meta["snap_step"])
        while step < snap_step + replay_steps:
            observe_and_close(step, record=True)
            step += 1
            open_selects(step, record=True)
        if client.hget(keys.meta(name), "snap").decode() != meta["snap"]:
            raise RuntimeError("a second snapshot was written during the replay window; lower --replay-steps")
        before = post("/select", select_body(step, seed=12345)).json()["prompt_ids"]
        http.close()
        t_kill = time.perf_counter()
        svc.kill()
        svc2 = ServiceProcess(redis_url=url, prefix=prefix, env=env).start()
        services.append(svc2)
        t_ready = time.perf_counter()
        with httpx.Client(base_url=svc2.url, timeout=600) as http2:
            after = http2.post("/select", json=select_body(step, seed=12345))
            t_first = time.perf_counter()
            after.raise_for_status()
            t = time.perf_counter()
            http2.post("/select", json=select_body(step)).raise_for_status()
            second_s = time.perf_counter() - t
            pid2 = svc2.proc.pid
            out["restart"] = {
                "replayed_closes": step - snap_step,
                "replayed_prompt_updates": (step - snap_step) * n,
                "kill_to_ready_s": t_ready - t_kill,
                "first_select_s": t_first - t_ready,
                "kill_to_first_select_s": t_first - t_kill,
                "next_select_ms": second_s * 1e3,
                "same_batch": after.json()["prompt_ids"] == before,
                "rss_bytes_per_prompt": (rss(pid2) - idle) / n,
                "peak_bytes_per_prompt": (proc_status_bytes(pid2, "VmHWM") - idle) / n,
            }
            http2.delete(f"/datasets/{name}")
        out["steps"] = step
        for key, xs in lat.items():
            out[f"{key}_p50_ms"] = _ms(median(xs))
            out[f"{key}_p90_ms"] = _ms(pct(xs, 90))
            out[f"{key}_max_ms"] = _ms(max(xs) if xs else None)
        out["snapshot_log"] = [line.strip() for line in svc.lines if "snapshot of" in line][:3]
    finally:
        watch.stop()
        for s in services:
            s.kill()
        client.close()
        if private is not None:
            private.stop()
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def print_service(s: dict) -> None:
    print(f"\nService at N={fmt_n(s['n'])}, B={s['batch']} (real process, private Redis)")
    print(
        f"create dataset: {s['create_s']:.2f} s; import of long-run beliefs"
        f" ({s['import_bytes'] / 2**20:.0f} MiB): {s['import_s']:.1f} s; idle RSS {s['rss_idle_mb']:.0f} MB"
    )
    print(
        f"RSS per prompt above idle: after create {s['rss_after_create_bytes_per_prompt']:.1f} B,"
        f" after import {s['rss_after_import_bytes_per_prompt']:.1f} B, steady"
        f" {s['rss_steady_bytes_per_prompt']:.1f} B, peak (incl. snapshot copy)"
        f" {s['rss_peak_bytes_per_prompt']:.1f} B (budget {TARGETS['bytes_per_prompt']} B)"
    )
    print(f"{'request':<34}{'p50 ms':>10}{'p90 ms':>10}{'max ms':>10}")
    for key, label in (
        ("observe", f"/observe {s['batch']} results"),
        ("select_close", "/select dps, closes a step"),
        ("select", "/select dps at the open step"),
        ("select_insight", "/select insight (pool 16 B)"),
    ):
        print(f"{label:<34}{s[key + '_p50_ms']:>10.1f}{s[key + '_p90_ms']:>10.1f}{s[key + '_max_ms']:>10.1f}")
    sn = s["snapshot"]
    print(
        f"snapshot: {sn['bytes'] / 2**20:.0f} MiB in {sn['chunks']} chunk(s) (largest"
        f" {sn['largest_chunk_bytes'] / 2**20:.0f} MiB; raw {sn['raw_bytes'] / 2**20:.0f} MiB), written in"
        f" {sn['write_s'] or float('nan'):.2f} s; {sn['selects_during']} /select during it: p50"
        f" {sn['select_during_p50_ms'] or float('nan'):.0f} ms, max {sn['select_during_max_ms'] or float('nan'):.0f} ms"
    )
    r = s["restart"]
    print(
        f"restart after kill -9 with {r['replayed_closes']} closes to replay: ready {r['kill_to_ready_s']:.1f} s,"
        f" first /select {r['first_select_s']:.1f} s later, total {r['kill_to_first_select_s']:.1f} s"
        f" (target < {TARGETS['restart_s']:.0f} s); same batch as before the kill: {r['same_batch']}"
    )


# ---- plot -----------------------------------------------------------------------------------------
def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    kern = result["kernels"]
    all_n = [r["n"] for r in kern] or [1e5]
    for regime, color, label in (
        ("full", "C0", "every prompt observed"),
        ("sparse", "C2", "sparse: 1e5 ever observed"),
    ):
        rows = [r for r in kern if r["regime"] == regime]
        if not rows:
            continue
        xs = [r["n"] for r in rows]
        ax.plot(xs, [r["step_s"] for r in rows], "o-", color=color, label=f"close + DPS select, {label}")
        proj = result["projection_1e8"].get(regime, {})
        if "step_s" in proj and not proj.get("measured"):
            ax.plot([xs[-1], proj["n"]], [rows[-1]["step_s"], proj["step_s"]], ":", color=color)
            ax.plot([proj["n"]], [proj["step_s"]], "o", mfc="white", color=color, label="  10^8 projected")
    grid = np.logspace(math.log10(min(all_n)), 8, 50)
    ax.plot(
        grid,
        (CLOSE_BYTES + SELECT_BYTES) * grid / result["stream_bandwidth_gb_per_s"] / 1e9,
        "-",
        color="grey",
        lw=1,
        label=f"bandwidth floor, every prompt observed ({CLOSE_BYTES + SELECT_BYTES} B/prompt)",
    )
    ref = result["reference"]
    if ref:
        ax.plot(
            [r["n"] for r in ref],
            [r["step_s"] for r in ref],
            "s-",
            color="C3",
            label="dict-based reference sampler (measured)",
        )
        last = ref[-1]
        ax.plot(
            [last["n"], 1e8],
            [last["step_s"], last["step_s"] * 1e8 / last["n"]],
            ":",
            color="C3",
            label="  linear projection",
        )
    svc = result.get("service")
    if svc and "select_close_p50_ms" in svc:
        ax.plot(
            [svc["n"]],
            [(svc["select_close_p50_ms"]) / 1e3],
            "*",
            ms=14,
            color="C2",
            label="service: /select that closes a step (p50, HTTP)",
        )
    ax.plot([1e7], [PAPER_STEP_S_1E7], "X", ms=10, color="C1", label="DPS paper, reported (10^7)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("prompts in the dataset (N)")
    ax.set_ylabel("seconds per training step (selector side)")
    ax.set_title(f"DPS step cost vs dataset size ({result['cores']} cores)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- main -----------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes("1e5,1e6,1e7,1e8"),
        help="in-process sizes (prompts), comma-separated; 1e8 only with enough free memory",
    )
    ap.add_argument(
        "--reference-sizes",
        type=parse_sizes,
        default=parse_sizes("1e5,1e6"),
        help="sizes for the dictionary reference sampler (~1 KB and ~30 us per prompt)",
    )
    ap.add_argument(
        "--service-n",
        type=lambda s: int(float(s)),
        default=10_000_000,
        help="prompts in the service dataset (0 = skip the service part)",
    )
    ap.add_argument("--batch", type=int, default=256, help="batch size B (prompts per step)")
    ap.add_argument(
        "--observed",
        type=lambda s: int(float(s)),
        default=100_000,
        help="prompts ever observed in the sparse regime (default 1e5)",
    )
    ap.add_argument(
        "--memory-n",
        type=lambda s: int(float(s)),
        default=10_000_000,
        help="size for the bytes-per-prompt table at 1%%, 10%%, 100%% observed",
    )
    ap.add_argument("--repeats", type=int, default=5, help="timed steps per in-process size (median)")
    ap.add_argument("--reference-steps", type=int, default=2, help="timed steps per reference size")
    ap.add_argument(
        "--replay-steps",
        type=int,
        default=19,
        help="closes the restart replays (capped by REPLAY_BUDGET / N)",
    )
    ap.add_argument(
        "--min-free-gb",
        type=float,
        default=14.0,
        help="measure the full regime at 1e8 only when this much memory is available",
    )
    ap.add_argument("--redis-url", default=None, help="use this Redis instead of a private server")
    ap.add_argument("--out", type=Path, default=OUT_DIR / "scale.json")
    args = ap.parse_args()

    t_start = time.perf_counter()
    bandwidth = stream_bandwidth()
    cpu_bandwidth = stream_bandwidth(clock=time.process_time)
    result: dict[str, Any] = {
        "cores": os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "memory_total_gb": psutil.virtual_memory().total / 1e9,
        "stream_bandwidth_gb_per_s": bandwidth / 1e9,
        "stream_bandwidth_gb_per_cpu_s": cpu_bandwidth / 1e9,
        "belief_bytes_per_prompt": BeliefArrays.new(1).nbytes_per_prompt,
        "batch": args.batch,
        "hmm_decay": HMM_DECAY,
        "paper_step_s_1e7": PAPER_STEP_S_1E7,
        "paper_gib_1e7": PAPER_GIB_1E7,
        "targets": TARGETS,
    }
    print(f"cores={os.cpu_count()} stream bandwidth {bandwidth / 1e9:.1f} GB/s (np.copyto, read + write)")

    sizes = sorted(set(args.sizes) | set(args.reference_sizes))
    kernels, skipped = [], []
    for n in sizes:
        for regime in ("sparse", "full"):
            per_prompt = (
                BeliefArrays.bytes_per_prompt(1.0) if regime == "full" else BeliefArrays.bytes_per_prompt(0.0)
            )
            need = n * (per_prompt + 20) + 65 * args.observed  # arrays + build and select temporaries
            free = psutil.virtual_memory().available
            if n >= 100_000_000 and regime == "full" and free < args.min_free_gb * 1e9:
                print(f"skipping {fmt_n(n)} {regime}: {free / 1e9:.1f} GB available < {args.min_free_gb} GB")
                skipped.append((n, regime))
                continue
            if free < need:
                print(
                    f"skipping {fmt_n(n)} {regime}: needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB available"
                )
                skipped.append((n, regime))
                continue
            row = kernel_figures(n, regime, args.batch, args.repeats, bandwidth, args.observed, cpu_bandwidth)
            kernels.append(row)
            print(f"  {fmt_n(n)} {regime}: step {row['step_s'] * 1e3:.2f} ms", flush=True)
    result["kernels"] = kernels
    print_kernels(kernels)
    result["memory"] = memory_table(args.memory_n)
    print(
        f"\nBelief bytes per prompt at N = {fmt_n(args.memory_n)} (layout formula / arrays held, capacity included)"
    )
    for r in result["memory"]:
        print(
            f"  {r['observed_share']:>5.0%} observed: {r['formula_bytes_per_prompt']:6.2f} /"
            f" {r['held_bytes_per_prompt']:6.2f} B (budget {TARGETS['bytes_per_prompt']})"
        )

    result["projection_1e8"] = {}
    for regime in ("sparse", "full"):
        measured = next((r for r in kernels if r["n"] == 100_000_000 and r["regime"] == regime), None)
        below = [r for r in kernels if r["n"] < 100_000_000 and r["regime"] == regime]
        proj = project(below, 100_000_000, regime) if below else {"n": 100_000_000, "regime": regime}
        proj["measured"] = measured is not None
        if measured is not None and "step_s" in proj:
            proj["measured_step_s"] = measured["step_s"]
            proj["measured_over_projected"] = measured["step_s"] / proj["step_s"]
        result["projection_1e8"][regime] = proj
        if "step_s" in proj:
            line = (
                f"10^8 {regime}: projected step {proj['step_s'] * 1e3:.1f} ms (close {proj['close_s'] * 1e3:.1f}"
                f" ms + DPS select {proj['select_dps_s'] * 1e3:.1f} ms) from {fmt_n(proj['basis_n'])},"
                f" {proj['array_gb']:.1f} GB of beliefs"
            )
            if measured is not None:
                line += (
                    f"; measured {measured['step_s'] * 1e3:.1f} ms ({proj['measured_over_projected']:.2f}x)"
                )
            print(line)

    reference_rows = []
    for n in args.reference_sizes:
        reference_rows.append(reference_figures(n, args.batch, args.reference_steps))
        print(f"  reference {fmt_n(n)}: step {reference_rows[-1]['step_s']:.2f} s", flush=True)
    by_n = {r["n"]: r for r in kernels if r["regime"] == "full"}
    reference = []
    for row in reference_rows:
        ours = by_n.get(row["n"])
        if ours:
            row["speedup_close"] = row["close_s"] / ours["close_s"]
            row["speedup_select"] = row["select_dps_s"] / ours["select_dps_s"]
            row["speedup_step"] = row["step_s"] / ours["step_s"]
            row["speedup_step_1thread"] = row["step_s"] / ours["step_s_1thread"]
            reference.append(row)
    result["reference"] = reference
    if reference:
        print_reference(reference)
        last = reference[-1]
        result["reference_projection"] = {
            str(n): {
                "step_s": last["step_s"] * n / last["n"],
                "memory_gb": last["traced_bytes_per_prompt"] * n / 1e9,
                "basis": f"per-prompt cost of the measured {fmt_n(last['n'])} run times N",
            }
            for n in (10_000_000, 100_000_000)
        }

    if args.service_n:
        # Bench process, service (the import holds the export and its decoded copies at once) and Redis.
        need = SERVICE_BYTES_PER_PROMPT * args.service_n
        free = psutil.virtual_memory().available
        if free < need:
            reason = f"needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB available"
            print(f"skipping the service part at {fmt_n(args.service_n)}: {reason}")
            result["service"] = {"n": args.service_n, "skipped": reason}
        else:
            result["service"] = service_figures(args.service_n, args.batch, args.replay_steps, args.redis_url)
            print_service(result["service"])

    result["elapsed_s"] = time.perf_counter() - t_start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(result, args.out.with_suffix(".png"))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')} in {result['elapsed_s']:.0f} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
