"""Scale figures: a DPS step at 10^5..10^8 prompts in-process, a 10^7-prompt dataset in the real service,
and the dictionary-based reference sampler in the same process.

    python bench/bench_scale.py [--sizes 1e5,1e6,1e7,1e8] [--reference-sizes 1e5,1e6] [--service-n 1e7]

Three parts, each optional:

1. In-process kernels (selector_service.core), at every size of --sizes, in two regimes side by side:
   "sparse" (--observed prompts ever observed, default 10^5: a step observes B of them) and "full"
   (every prompt observed, the worst case). Per regime: close_step (the DPS update of the observed set,
   hmm_decay 0.7) after observing a batch, a DPS select over the whole dataset (docs/methods.md §2) and an
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
import os
import sys
import time
from pathlib import Path
from typing import Any

import numba
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OUT_DIR, emit, fmt_n, parse_count, parse_sizes, stream_bandwidth
from bench.scale import kernels, reference, service
from bench.scale.kernels import HMM_DECAY
from bench.scale.plot import plot
from bench.scale.service import PAPER_GIB_1E7, PAPER_STEP_S_1E7, SERVICE_BYTES_PER_PROMPT, TARGETS
from selector_service.core import BeliefArrays


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    bandwidth, cpu_bandwidth = stream_bandwidth(), stream_bandwidth(clock=time.process_time)
    print(f"cores={os.cpu_count()} stream bandwidth {bandwidth / 1e9:.1f} GB/s (np.copyto, read + write)")
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

    # 1. In-process kernels, both regimes, every size (the reference's sizes too, to compare at equal N).
    sizes = sorted(set(args.sizes) | set(args.reference_sizes))
    result["kernels"] = kernels.measure(
        sizes, args.batch, args.repeats, args.observed, args.min_free_gb, bandwidth, cpu_bandwidth
    )
    kernels.print_kernels(result["kernels"])
    result["memory"] = kernels.memory_table(args.memory_n)
    kernels.print_memory(result["memory"], args.memory_n, TARGETS["bytes_per_prompt"])
    result["projection_1e8"] = kernels.projections_1e8(result["kernels"])

    # 2. The dictionary-based reference sampler at the same sizes.
    result["reference"] = reference.compare(
        args.reference_sizes, args.batch, args.reference_steps, result["kernels"]
    )
    if result["reference"]:
        reference.print_reference(result["reference"])
        result["reference_projection"] = reference.projection(result["reference"])

    # 3. The service, when the machine has the memory for it.
    if args.service_n:
        result["service"] = run_service(args)

    result["elapsed_s"] = time.perf_counter() - started
    plot(result, args.out.with_suffix(".png"))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')} in {result['elapsed_s']:.0f} s")
    emit(result, args.out)


def run_service(args: argparse.Namespace) -> dict[str, Any]:
    # Bench process, service (the import holds the export and its decoded copies at once) and Redis.
    need = SERVICE_BYTES_PER_PROMPT * args.service_n
    free = psutil.virtual_memory().available
    if free < need:
        reason = f"needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB available"
        print(f"skipping the service part at {fmt_n(args.service_n)}: {reason}")
        return {"n": args.service_n, "skipped": reason}
    figures = service.service_figures(args.service_n, args.batch, args.replay_steps, args.redis_url)
    service.print_service(figures)
    return figures


def parse_args() -> argparse.Namespace:
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
        type=parse_count,
        default=10_000_000,
        help="prompts in the service dataset (0 = skip the service part)",
    )
    ap.add_argument("--batch", type=int, default=256, help="batch size B (prompts per step)")
    ap.add_argument(
        "--observed",
        type=parse_count,
        default=100_000,
        help="prompts ever observed in the sparse regime (default 1e5)",
    )
    ap.add_argument(
        "--memory-n",
        type=parse_count,
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
    return ap.parse_args()


if __name__ == "__main__":
    main()
