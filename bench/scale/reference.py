"""Part 2 of bench/bench_scale.py: the dictionary-based reference sampler (bench/reference_dps_sampler.py,
the DPS authors' design) in the same process, against the kernels at the same size."""

from __future__ import annotations

import gc
import os
import statistics
import time
import tracemalloc
from typing import Any

import numpy as np

from bench.common import fmt_n, rss
from bench.reference_dps_sampler import DictHMMSampler
from bench.scale.kernels import HMM_DECAY


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


def compare(sizes: list[int], batch: int, steps: int, kernels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reference at every size, with its speed-up against the kernels' full regime at the same size
    (sizes the kernels did not measure are left out)."""
    full = {r["n"]: r for r in kernels if r["regime"] == "full"}
    rows = []
    for n in sizes:
        row = reference_figures(n, batch, steps)
        print(f"  reference {fmt_n(n)}: step {row['step_s']:.2f} s", flush=True)
        ours = full.get(n)
        if ours:
            row["speedup_close"] = row["close_s"] / ours["close_s"]
            row["speedup_select"] = row["select_dps_s"] / ours["select_dps_s"]
            row["speedup_step"] = row["step_s"] / ours["step_s"]
            row["speedup_step_1thread"] = row["step_s"] / ours["step_s_1thread"]
            rows.append(row)
    return rows


def projection(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The reference's cost at 10^7 and 10^8: the largest measured size's cost per prompt times N."""
    last = rows[-1]
    return {
        str(n): {
            "step_s": last["step_s"] * n / last["n"],
            "memory_gb": last["traced_bytes_per_prompt"] * n / 1e9,
            "basis": f"per-prompt cost of the measured {fmt_n(last['n'])} run times N",
        }
        for n in (10_000_000, 100_000_000)
    }
