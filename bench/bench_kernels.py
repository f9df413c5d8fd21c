"""Kernel benchmarks of the selection core (selector_service.core): throughput, memory, compile time.

Measures, each with a warm-up call and the median of --repeats timed calls:

- INSIGHT scoring (wmi_scores, K = 8) in prompts/s, on one thread (numba.set_num_threads(1)) and on
  all cores. Target: >= 5 M prompts/s per core. One-thread figures are also given per CPU second
  (time.process_time), which other processes on a shared machine distort much less than wall time.
- DPS close_step over N prompts (default 1e7), every one observed (the worst case: the close walks only
  the observed set), in prompts/s, one thread and all cores. Target: >= 20 M prompts/s on 2 cores. The
  pass is memory-bound at large N, so it also reports the floor: bytes read and written per prompt
  divided by the stream bandwidth of a numpy copy of a large array measured in the same run (read +
  write bytes / time), and the measured rate as a share of that floor. Then the whole-dataset DPS select
  (CPU seconds) against its read floor (the 12-byte prior row of every prompt). Targets: close within
  2x, select within 3x of their floors.
- Bytes of belief state per prompt (BeliefArrays; budget <= 128): every prompt observed, 1% and 10%.
- Cold start (docs/methods.md §6, 7): memory measured with tracemalloc over a round at --n-cold prompts (default
  1e6): metadata upload (10 groups, pass rates for half), two steps of a select of every strategy, an
  observe and a close: what stays allocated afterwards (state + caches: epoch permutations, SEC's member
  index) and the largest transient of one operation on top of it, per prompt; and whole-dataset INSIGHT
  scores with metadata (cold priors gathered per prompt) against the same scores without metadata, as a
  time ratio in one run.
- topk_random_ties against plain np.argpartition(-scores, k-1) at 1e6 scores, as a time ratio: random
  scores, and three arrangements with 99% of the scores tied at 1/3 (as in DPS); CPU seconds of each
  (both run on one thread).
- The counter-based generator (core/rng.py) against the numpy calls it replaced, as time ratios in
  one run: epoch permutations at --perm-sizes (default 1e7 and 1e8: Fisher-Yates on our bounded ints,
  int32 output, vs Generator.permutation, int64 output then int32 as the service used to keep it) with
  the bytes each holds at its peak; candidate pools (Floyd's sample of 4096 from 1e7 vs
  Generator.choice(replace=False)); 4096 Beta draws (Marsaglia-Tsang in log space vs Generator.beta).
- numba compile cost: a child interpreter with an empty cache directory (cold compile of every kernel)
  and a second one reusing that directory (what a restart pays with cache=True).

Prints one line per figure (with os.cpu_count()), writes bench/out/kernels.json, and ends stdout with
the same figures as one JSON line. Defaults fit in ~3 GB of RAM and run in about a minute on 2 cores;
`--n` shrinks the DPS size (the other sizes are min(--n, 1e6)).

    python bench/bench_kernels.py [--n 10000000] [--repeats 5] [--no-compile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import OUT_DIR, add_out, emit, stream_bandwidth, timed
from selector_service.core import (
    STRATEGIES,
    BeliefArrays,
    apply_results,
    close_step,
    select,
    strategies,
    stream,
    topk_random_ties,
    wmi_scores,
)
from selector_service.core.coldstart import apply_metadata
from selector_service.core.step_close import close_open_step

OUT = OUT_DIR / "kernels.json"
#: Bytes close_step moves per prompt: reads hmm_d (36) + hmm_prior (12) + hmm_prev (12) + step_state (1),
#: writes hmm_d, hmm_prior, hmm_prev (60); step_state is written back only for observed prompts.
DPS_BYTES_READ = 36 + 12 + 12 + 1
DPS_BYTES_WRITTEN = 36 + 12 + 12
#: Bytes a whole-dataset DPS select must read per prompt at least: its float32[3] prior row.
SELECT_BYTES = 12

COMPILE_SCRIPT = """
import time
t0 = time.perf_counter()
import numpy as np
from selector_service.core import (BeliefArrays, apply_results, close_step, dps_scores, outcomes_from_flat,
                                   select, STRATEGIES, ROLLOUT_POLICIES, allocate_rollouts, stream)
from selector_service.core._parallel import PARALLEL_MIN
from selector_service.core.coldstart import apply_metadata
t1 = time.perf_counter()
outcomes_from_flat(np.array([1.0, 0.0]), np.array([0, 2]), "binary", 1.0)
for size in (100, PARALLEL_MIN + 1):  # serial and parallel kernels
    part = BeliefArrays.new(size)
    ids = np.arange(size)
    apply_results(part, ids, np.ones(size), np.full(size, 2.0), np.full(size, 2, np.int8), 1.0, 1.0, 1.0)
    apply_metadata(part, 0, np.full(size, 0.5), np.arange(size, dtype=np.int32) % 3)
    close_step(part, 0.7)
    for name in STRATEGIES:
        params = {"candidate_ratio": None} if "candidate_ratio" in STRATEGIES[name].params else {}
        select(part, strategy=name, params=params, batch_size=8, step=0, seed=0, key="b", dataset_k=8)
    dps_scores(part.obs_prior[: part.observed], None, 0.1)
for policy in ROLLOUT_POLICIES:
    allocate_rollouts(np.ones(4), np.ones(4), np.arange(4), budget=20, max_rollouts=8, policy=policy,
                      rng=stream("b", 0, 0, "rollouts"))
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
"""


def report(results: dict[str, Any], name: str, value: Any, unit: str, note: str = "") -> None:
    results[name] = value
    shown = f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"
    print(f"{name:<40} {shown:>14} {unit:<14} cpu_count={os.cpu_count()} {note}", flush=True)


def bench_wmi(results: dict, n: int, repeats: int, all_threads: int) -> None:
    rng = np.random.default_rng(0)
    alpha = 1.0 + rng.gamma(0.5, 20.0, n)
    beta = 1.0 + rng.gamma(0.5, 20.0, n)
    for threads, label in ((1, "1thread"), (all_threads, "allcores")):
        numba.set_num_threads(threads)
        seconds = timed(lambda: wmi_scores(alpha, beta, None, 8, 3.0, 0.3), repeats)
        report(
            results,
            f"wmi_k8_mprompts_per_s_{label}",
            n / seconds / 1e6,
            "M prompts/s",
            f"threads={threads} n={n:,}",
        )
        if threads == 1:
            cpu = timed(lambda: wmi_scores(alpha, beta, None, 8, 3.0, 0.3), repeats, time.process_time)
            report(
                results, "wmi_k8_mprompts_per_cpu_s", n / cpu / 1e6, "M prompts/s", "1 thread, per CPU second"
            )
    numba.set_num_threads(all_threads)


def dps_close_rates(results: dict, n: int, repeats: int, all_threads: int) -> None:
    """close_step throughput over n prompts (the beliefs are freed on return)."""
    ba = BeliefArrays.new(n)
    report(
        results,
        "belief_bytes_per_prompt",
        ba.nbytes_per_prompt,
        "bytes",
        "every prompt observed; budget <= 128",
    )
    for share in (0.01, 0.1):
        report(
            results,
            f"belief_bytes_per_prompt_{round(share * 100)}pct_observed",
            BeliefArrays.bytes_per_prompt(share),
            "bytes",
            "25 per prompt + 65 per observed prompt",
        )
    rng = np.random.default_rng(1)
    m = min(4096, n)
    # the worst case for the close: every prompt observed (it walks only the observed set)
    every = np.arange(n)
    states = rng.integers(1, 4, n).astype(np.int8)
    apply_results(ba, every, np.where(states == 1, 0.0, 4.0), np.full(n, 8.0), states, 1.0, 1.0, 1.0)
    close_step(ba, 0.7)

    def one_step(clock=time.perf_counter):  # observe a batch, then close the step (only the close is timed)
        ids = rng.choice(n, m, replace=False)
        states = rng.integers(1, 4, m).astype(np.int8)
        apply_results(ba, ids, np.where(states == 1, 0.0, 4.0), np.full(m, 8.0), states, 1.0, 1.0, 1.0)
        t = clock()
        close_step(ba, 0.7)
        return clock() - t

    for threads, label in ((1, "1thread"), (all_threads, "allcores")):
        numba.set_num_threads(threads)
        one_step()
        seconds = statistics.median(one_step() for _ in range(repeats))
        report(
            results,
            f"dps_close_mprompts_per_s_{label}",
            n / seconds / 1e6,
            "M prompts/s",
            f"threads={threads} n={n:,}",
        )
        results[f"dps_close_seconds_{label}"] = seconds
        if threads == 1:
            cpu = statistics.median(one_step(time.process_time) for _ in range(repeats))
            report(
                results,
                "dps_close_mprompts_per_cpu_s",
                n / cpu / 1e6,
                "M prompts/s",
                "1 thread, per CPU second",
            )
    numba.set_num_threads(all_threads)
    # DPS select over the whole dataset (two passes over the prior rows, no score array), CPU seconds
    cpu = timed(
        lambda: strategies.select(
            ba, strategy="dps", params=None, batch_size=256, step=1, seed=0, key="b", dataset_k=8
        ),
        repeats,
        time.process_time,
    )
    results["dps_select_cpu_seconds"] = cpu


def bench_dps(results: dict, n: int, repeats: int, all_threads: int) -> None:
    dps_close_rates(results, n, repeats, all_threads)
    bandwidth = stream_bandwidth(min(1 << 30, max(n * 16, 1 << 24)), repeats)
    per_prompt = DPS_BYTES_READ + DPS_BYTES_WRITTEN
    floor = bandwidth / per_prompt / 1e6
    report(results, "stream_bandwidth_gb_per_s", bandwidth / 1e9, "GB/s", "numpy copy, read+write, 1 thread")
    report(
        results,
        "dps_bytes_per_prompt_moved",
        per_prompt,
        "bytes",
        f"read {DPS_BYTES_READ} + written {DPS_BYTES_WRITTEN}",
    )
    report(results, "dps_memory_floor_mprompts_per_s", floor, "M prompts/s", "bandwidth / bytes per prompt")
    report(
        results, "dps_share_of_memory_floor", results["dps_close_mprompts_per_s_allcores"] / floor, "x floor"
    )
    report(
        results,
        "dps_close_1thread_x_floor",
        floor / results["dps_close_mprompts_per_s_1thread"],
        "x floor",
        "time of the 1-thread close / bandwidth floor",
    )
    # The same comparison in CPU seconds (close and copy both on one thread): on a shared machine the
    # wall-clock figures above include time the process was not running at all.
    cpu_bandwidth = stream_bandwidth(min(1 << 30, max(n * 16, 1 << 24)), repeats, time.process_time)
    cpu_floor = cpu_bandwidth / per_prompt / 1e6
    results["stream_bandwidth_gb_per_cpu_s"] = cpu_bandwidth / 1e9
    report(
        results,
        "dps_close_cpu_x_floor",
        cpu_floor / results["dps_close_mprompts_per_cpu_s"],
        "x floor",
        f"per CPU second: close {results['dps_close_mprompts_per_cpu_s']:.1f} M/s vs copy floor {cpu_floor:.1f} M/s",
    )
    select_floor = SELECT_BYTES * n / cpu_bandwidth
    report(
        results,
        "dps_select_x_read_floor",
        results["dps_select_cpu_seconds"] / select_floor,
        "x floor",
        f"n={n:,} B=256, {results['dps_select_cpu_seconds'] * 1e3:.1f} ms CPU vs {select_floor * 1e3:.1f} ms "
        f"CPU copying {SELECT_BYTES} B/prompt",
    )


def bench_topk(results: dict, n: int, repeats: int) -> None:
    rng = np.random.default_rng(2)
    k = min(1024, n)
    u = rng.random(n)
    cases = {  # (scores, k)
        "random": (rng.random(n), k),
        # 99% tie at 1/3, the k-th largest above the tie
        "ties99": (np.where(u < 0.99, 1.0 / 3.0, rng.random(n)), k),
        # DPS after a step: 99% at 1/3, 0.5% at 0.4, 0.5% at 0.3; the batch reaches into the tie
        "ties99_dps": (np.where(u < 0.99, 1.0 / 3.0, np.where(rng.random(n) < 0.5, 0.4, 0.3)), min(4 * k, n)),
        # the tie is the maximum: numpy's introselect is slow on this arrangement
        "ties99_top": (np.where(u < 0.99, 1.0 / 3.0, 0.3 * rng.random(n)), k),
    }
    repeats = 4 * repeats  # milliseconds each: more samples steady the median on a busy machine
    for label, (scores, k) in cases.items():
        # both single-threaded: compare CPU seconds, which other processes on the machine barely move
        ours = timed(
            lambda s=scores, k=k: topk_random_ties(s, k, stream("bench", 0, 0, "ties")),
            repeats,
            time.process_time,
        )
        plain = timed(lambda s=scores, k=k: np.argpartition(-s, k - 1)[:k], repeats, time.process_time)
        report(
            results,
            f"topk_vs_argpartition_ratio_{label}",
            ours / plain,
            "x",
            f"n={n:,} k={k} ({ours * 1e3:.2f} ms vs {plain * 1e3:.2f} ms)",
        )


def _cold_round(ba: BeliefArrays, rng: np.random.Generator, key: str, batch: int = 256) -> dict[str, int]:
    """Two steps of every strategy's select, an observe and a close; returns each operation's peak bytes
    above what was allocated when it started (tracemalloc must be running)."""
    import tracemalloc

    peaks: dict[str, int] = {}

    def traced(label: str, fn):
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = fn()
        peaks[label] = max(peaks.get(label, 0), tracemalloc.get_traced_memory()[1] - before)
        return out

    for step in range(2):
        for name in STRATEGIES:
            params = {"candidate_ratio": None} if name == "insight" else {}
            ids, _ = traced(
                name,
                lambda name=name, params=params, step=step: select(
                    ba,
                    strategy=name,
                    params=params,
                    batch_size=batch,
                    step=step,
                    seed=0,
                    key=key,
                    dataset_k=8,
                ),
            )
        states = rng.integers(1, 4, batch).astype(np.int8)
        apply_results(ba, ids, np.where(states == 1, 0.0, 4.0), np.full(batch, 8.0), states, 1.0, 1.0, 1.0)
        traced("close", lambda: close_open_step(ba, hmm_decay=0.7, key=key))
    return peaks


def _cold_dataset(n: int, rng: np.random.Generator) -> BeliefArrays:
    ba = BeliefArrays.new(n)
    rates = np.where(rng.random(n) < 0.5, rng.random(n), np.nan).astype(np.float32)
    apply_metadata(ba, 0, rates, rng.integers(0, 10, n).astype(np.int32))
    return ba


def bench_cold_memory(results: dict, n: int) -> None:
    """Bytes per prompt of a dataset with metadata over one round of every operation (tracemalloc sees
    numpy's allocations), after a warm-up round on a small dataset (so compiling is not counted): the
    state, what stays allocated after the round (state + caches: epoch permutations, SEC's member
    index), and the largest transient of one operation on top of that."""
    import gc
    import tracemalloc

    rng = np.random.default_rng(3)
    tracemalloc.start()
    _cold_round(_cold_dataset(50_000, rng), rng, "warm-up")
    gc.collect()
    start = tracemalloc.get_traced_memory()[0]
    ba = _cold_dataset(n, rng)
    peaks = _cold_round(ba, rng, "m")
    gc.collect()
    current = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    worst = max(peaks, key=peaks.get)
    report(
        results,
        "cold_state_bytes_per_prompt",
        ba.nbytes_per_prompt,
        "bytes",
        "every prompt observed (43 + 65 per observed prompt), budget <= 128",
    )
    report(
        results,
        "cold_retained_bytes_per_prompt",
        current / n,
        "bytes",
        f"n={n:,}, state + caches after a round",
    )
    report(
        results,
        "cold_largest_transient_bytes_per_prompt",
        peaks[worst] / n,
        "bytes",
        f"n={n:,}, on top of the retained, by {worst}",
    )
    results["cold_transient_bytes_per_prompt_by_operation"] = {k: round(v / n, 2) for k, v in peaks.items()}
    del ba


def bench_cold_scores(results: dict, n: int, repeats: int) -> None:
    """Whole-dataset INSIGHT with cold priors (metadata) vs without, CPU seconds on one thread."""
    rng = np.random.default_rng(4)
    plain = BeliefArrays.new(n)
    cold = BeliefArrays.new(n)
    apply_metadata(cold, 0, np.where(rng.random(n) < 0.5, rng.random(n), np.nan), rng.integers(0, 10, n))
    ids = rng.choice(n, n // 10, replace=False)
    states = rng.integers(1, 4, ids.size).astype(np.int8)
    for ba in (plain, cold):
        apply_results(ba, ids, np.where(states == 1, 0.0, 4.0), np.full(ids.size, 8.0), states, 1.0, 1.0, 1.0)
    numba.set_num_threads(1)
    kw = dict(
        strategy="insight",
        params={"candidate_ratio": None},
        batch_size=256,
        step=0,
        seed=0,
        key="c",
        dataset_k=8,
    )
    with_meta = timed(lambda: select(cold, **kw), repeats, time.process_time)
    without = timed(lambda: select(plain, **kw), repeats, time.process_time)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    report(
        results,
        "cold_insight_whole_dataset_ratio",
        with_meta / without,
        "x",
        f"n={n:,}, with metadata vs without ({with_meta * 1e3:.1f} ms vs {without * 1e3:.1f} ms, 1 thread)",
    )


def bench_rng(results: dict, perm_sizes: list[int], repeats: int) -> None:
    """Our generator vs the numpy calls it replaced (ratios > 1: ours is slower)."""
    gen = np.random.Generator(np.random.PCG64(0))
    ours_stream = stream("bench", 0, 0, "rng")
    for n in perm_sizes:
        reps = max(1, min(repeats, 3)) if n >= 10**8 else repeats
        ours = timed(lambda n=n: ours_stream.permutation(n), reps)
        theirs = timed(lambda n=n: gen.permutation(n).astype(np.int32), reps)
        report(
            results,
            f"permutation_vs_numpy_ratio_{fmt_size(n)}",
            ours / theirs,
            "x",
            f"n={n:,} ({ours:.2f} s vs {theirs:.2f} s; peak {4 * n / 1e6:.0f} MB vs {12 * n / 1e6:.0f} MB)",
        )
        results[f"permutation_seconds_{fmt_size(n)}"] = {"ours": ours, "numpy": theirs}
    n, k = 10_000_000, 4096
    ours = timed(lambda: ours_stream.sample(n, k), 20 * repeats)
    theirs = timed(lambda: gen.choice(n, size=k, replace=False), 20 * repeats)
    report(
        results,
        "pool_sample_vs_numpy_ratio",
        ours / theirs,
        "x",
        f"{k} of {n:,} ({ours * 1e6:.0f} us vs {theirs * 1e6:.0f} us)",
    )
    a = 1.0 + np.random.default_rng(3).gamma(0.5, 20.0, k)
    b = 1.0 + np.random.default_rng(4).gamma(0.5, 20.0, k)
    items = np.arange(k)
    ours = timed(lambda: ours_stream.beta(a, b, items), 20 * repeats)
    theirs = timed(lambda: gen.beta(a, b), 20 * repeats)
    report(
        results,
        "beta_draws_vs_numpy_ratio",
        ours / theirs,
        "x",
        f"{k} draws ({ours * 1e6:.0f} us vs {theirs * 1e6:.0f} us)",
    )


def fmt_size(n: int) -> str:
    exp = np.log10(n)
    return f"1e{int(exp)}" if exp == int(exp) else str(n)


def bench_compile(results: dict) -> None:
    """Cold compile of every kernel (empty cache dir), then a run that loads them from that cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("cold", "cached"):
            out = subprocess.run(
                [sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True, text=True, check=True
            )
            import_s, first_calls_s = map(float, out.stdout.split())
            report(results, f"compile_{label}_first_calls_s", first_calls_s, "s", f"import {import_s:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n",
        type=int,
        default=10_000_000,
        help="prompts for the DPS close (default 1e7); other sizes min(n, 1e6)",
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed calls per figure, median reported (default 5)"
    )
    parser.add_argument(
        "--n-cold", type=int, default=1_000_000, help="prompts of the cold-start memory round (default 1e6)"
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the cold/cached compile measurement")
    parser.add_argument(
        "--perm-sizes",
        default="1e7,1e8",
        help="epoch permutation sizes for the generator comparison (default 1e7,1e8; '' skips)",
    )
    add_out(parser, OUT)
    args = parser.parse_args()
    if args.n < 1 or args.repeats < 1:
        parser.error("--n and --repeats must be >= 1")

    all_threads = numba.config.NUMBA_NUM_THREADS
    results: dict[str, Any] = {"cpu_count": os.cpu_count(), "numba_threads": all_threads, "n_dps": args.n}
    small = min(args.n, 1_000_000)
    results["n_wmi"] = results["n_topk"] = small
    bench_wmi(results, small, args.repeats, all_threads)
    bench_dps(results, args.n, args.repeats, all_threads)
    bench_topk(results, small, args.repeats)
    bench_cold_memory(results, args.n_cold)
    bench_cold_scores(results, small, args.repeats)
    perm_sizes = [int(float(x)) for x in args.perm_sizes.split(",") if x.strip()]
    bench_rng(results, perm_sizes, args.repeats)
    if not args.no_compile:
        bench_compile(results)
    results["numba_threading_layer"] = numba.threading_layer()
    emit(results, args.out)


if __name__ == "__main__":
    main()
