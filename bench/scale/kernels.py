"""Part 1 of bench/bench_scale.py: the selection core's DPS step in-process at 10^5..10^8 prompts, in the
sparse and the full regime, against its floors; the belief memory per prompt; the 10^8 projection."""

from __future__ import annotations

import gc
import os
import statistics
import time
from typing import Any

import numba
import numpy as np
import psutil

from bench.common import fmt_n, peak_rss, reset_peak_rss, rss
from selector_service.core import BeliefArrays, apply_results, close_step, strategies

HMM_DECAY = 0.7
#: Bytes close_step moves per prompt (dps.py): reads D (36) + prior (12) + prev (12) + step_state (1),
#: writes D, prior, prev (60).
CLOSE_BYTES = 61 + 60
#: Bytes a whole-dataset DPS select must read per prompt at least: the float32[3] prior row.
SELECT_BYTES = 12
#: The 10^8 size measured only with enough memory, otherwise projected.
N_1E8 = 100_000_000


def random_outcomes(rng: np.random.Generator, n: int, batch: int, k: int = 8):
    """`batch` distinct prompt ids with random states and matching success counts out of k."""
    ids = rng.choice(n, size=batch, replace=False).astype(np.int64)
    states = rng.integers(1, 4, size=batch).astype(np.int8)
    successes = np.where(states == 1, 0.0, np.where(states == 3, float(k), float(k // 2)))
    return ids, successes, np.full(batch, float(k)), states


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


class StepTimer:
    """Timed DPS steps on one belief state: observe a batch, close the step, DPS select over the whole
    dataset (and INSIGHT when asked); in the sparse regime np.argpartition over the observed count of
    floats is timed right after each step, under the same load."""

    def __init__(
        self, ba: BeliefArrays, pool: np.ndarray | None, batch: int, yardstick_n: int | None
    ) -> None:
        self.ba, self.pool, self.batch = ba, pool, batch
        self.rng = np.random.default_rng(0)
        self.yardstick = np.random.default_rng(0).random(yardstick_n) if yardstick_n else None
        self.kw = dict(batch_size=batch, seed=0, key="scale", dataset_k=8)
        self.cpu_close: list[float] = []
        self.cpu_dps: list[float] = []
        self.arg_wall: list[float] = []
        self.arg_cpu: list[float] = []

    def observe_batch(self) -> None:
        batch, n = self.batch, self.ba.n
        if self.pool is not None:
            ids = self.rng.choice(self.pool, size=batch, replace=False)
        else:
            ids = random_outcomes(self.rng, n, batch)[0]
        states = self.rng.integers(1, 4, size=batch).astype(np.int8)
        successes = np.where(states == 1, 0.0, np.where(states == 3, 8.0, 4.0))
        apply_results(self.ba, ids, successes, np.full(batch, 8.0), states, 1.0, 1.0, 1.0)

    def argpartition_now(self) -> None:
        assert self.yardstick is not None
        k = max(0, self.yardstick.size - self.batch)
        t, c = time.perf_counter(), time.process_time()
        np.argpartition(self.yardstick, k)
        self.arg_wall.append(time.perf_counter() - t)
        self.arg_cpu.append(time.process_time() - c)

    def steps(
        self, count: int, first_step: int, insight: bool
    ) -> tuple[list[float], list[float], list[float]]:
        """Wall seconds of close, DPS select and INSIGHT select over `count` steps after a warm-up one.
        Without INSIGHT (the one-thread pass) the CPU seconds of close and select are kept too."""
        closes, dps, ins = [], [], []
        for step in range(first_step, first_step + count + 1):  # the first one warms up
            self.observe_batch()
            t, c = time.perf_counter(), time.process_time()
            close_step(self.ba, HMM_DECAY)
            t_close, c_close = time.perf_counter() - t, time.process_time() - c
            t, c = time.perf_counter(), time.process_time()
            strategies.select(self.ba, strategy="dps", params=None, step=step + 1, **self.kw)
            t_dps, c_dps = time.perf_counter() - t, time.process_time() - c
            timed = step > first_step
            if timed and not insight:  # one thread: CPU seconds are comparable to the copy's
                self.cpu_close.append(c_close)
                self.cpu_dps.append(c_dps)
            if timed and self.yardstick is not None:
                self.argpartition_now()
            t = time.perf_counter()
            if insight:
                strategies.select(self.ba, strategy="insight", params=None, step=step + 1, **self.kw)
            t_ins = time.perf_counter() - t
            if timed:
                closes.append(t_close)
                dps.append(t_dps)
                ins.append(t_ins)
        return closes, dps, ins


def kernel_figures(
    n: int,
    regime: str,
    batch: int,
    repeats: int,
    bandwidth: float,
    observed: int,
    cpu_bandwidth: float,
) -> dict[str, Any]:
    """close_step, DPS select and INSIGHT select over n prompts in `regime` ("sparse": `observed`
    prompts ever observed; "full": all of them); memory per prompt."""
    pid = os.getpid()
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
    timer = StepTimer(ba, pool, batch, min(observed, n) if regime == "sparse" else None)
    closes, dps, insight = timer.steps(repeats, 0, True)
    peak = peak_rss(pid)
    # The same passes on one thread: on a small, busy machine the parallel launch can cost more than
    # it saves (each parallel region waits for every worker thread to be scheduled).
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        closes1, dps1, _ = timer.steps(repeats, repeats + 1, False)
    finally:
        numba.set_num_threads(threads)
    close_s, dps_s = statistics.median(closes), statistics.median(dps)
    row = {
        "n": n,
        "regime": regime,
        "observed": ba.observed,
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
        "array_bytes_per_prompt": ba.nbytes / n,
        "rss_bytes_per_prompt": resident / n,
        "peak_bytes_per_prompt": (peak - base) / n if peak is not None else None,
        "repeats": repeats,
    }
    row.update(floor_ratios(row, timer, bandwidth, cpu_bandwidth))
    return row


def floor_ratios(
    row: dict[str, Any], timer: StepTimer, bandwidth: float, cpu_bandwidth: float
) -> dict[str, Any]:
    """The step against its floors: the bandwidth floor of the observed set's passes (the full regime:
    every prompt), in wall and in CPU seconds of the one-thread steps (on a shared machine the wall-clock
    ratios include time this process did not run at all), and np.argpartition in the sparse regime."""
    m = row["observed"]
    close_floor, select_floor = CLOSE_BYTES * m / bandwidth, SELECT_BYTES * m / bandwidth
    cpu_c, cpu_d = statistics.median(timer.cpu_close), statistics.median(timer.cpu_dps)
    out = {
        "close_floor_s": close_floor,
        "select_dps_floor_s": select_floor,
        "step_floor_s": close_floor + select_floor,
        "close_x_floor": row["close_s"] / close_floor,
        "select_dps_x_floor": row["select_dps_s"] / select_floor,
        "close_cpu_s": cpu_c,
        "select_dps_cpu_s": cpu_d,
        "close_cpu_x_floor": cpu_c / (CLOSE_BYTES * m / cpu_bandwidth),
        "select_dps_cpu_x_floor": cpu_d / (SELECT_BYTES * m / cpu_bandwidth),
    }
    if row["regime"] == "sparse":
        arg, arg_c = statistics.median(timer.arg_wall), statistics.median(timer.arg_cpu)
        out.update(
            argpartition_s=arg,
            step_x_argpartition=row["step_s"] / arg,
            argpartition_cpu_s=arg_c,
            step_cpu_x_argpartition=(cpu_c + cpu_d) / arg_c,
        )
    return out


def measure(
    sizes: list[int],
    batch: int,
    repeats: int,
    observed: int,
    min_free_gb: float,
    bandwidth: float,
    cpu_bandwidth: float,
) -> list[dict[str, Any]]:
    """kernel_figures at every size in both regimes, skipping what the free memory cannot hold (10^8 in
    the full regime needs min_free_gb)."""
    rows = []
    for n in sizes:
        for regime in ("sparse", "full"):
            per_prompt = BeliefArrays.bytes_per_prompt(1.0 if regime == "full" else 0.0)
            need = n * (per_prompt + 20) + 65 * observed  # arrays + build and select temporaries
            free = psutil.virtual_memory().available
            if n >= N_1E8 and regime == "full" and free < min_free_gb * 1e9:
                print(f"skipping {fmt_n(n)} {regime}: {free / 1e9:.1f} GB available < {min_free_gb} GB")
                continue
            if free < need:
                print(
                    f"skipping {fmt_n(n)} {regime}: needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB available"
                )
                continue
            row = kernel_figures(n, regime, batch, repeats, bandwidth, observed, cpu_bandwidth)
            rows.append(row)
            print(f"  {fmt_n(n)} {regime}: step {row['step_s'] * 1e3:.2f} ms", flush=True)
    return rows


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


def print_memory(rows: list[dict[str, Any]], n: int, budget: int) -> None:
    print(f"\nBelief bytes per prompt at N = {fmt_n(n)} (layout formula / arrays held, capacity included)")
    for r in rows:
        print(
            f"  {r['observed_share']:>5.0%} observed: {r['formula_bytes_per_prompt']:6.2f} /"
            f" {r['held_bytes_per_prompt']:6.2f} B (budget {budget})"
        )


def projections_1e8(kernels: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per regime, 10^8 projected from the largest measured size below it, next to the measured 10^8
    step when there is one (a check of the basis)."""
    out = {}
    for regime in ("sparse", "full"):
        measured = next((r for r in kernels if r["n"] == N_1E8 and r["regime"] == regime), None)
        below = [r for r in kernels if r["n"] < N_1E8 and r["regime"] == regime]
        proj = project(below, N_1E8, regime) if below else {"n": N_1E8, "regime": regime}
        proj["measured"] = measured is not None
        if measured is not None and "step_s" in proj:
            proj["measured_step_s"] = measured["step_s"]
            proj["measured_over_projected"] = measured["step_s"] / proj["step_s"]
        out[regime] = proj
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
    return out
