"""Service latency over HTTP, as ratios to numpy.argpartition over N floats measured in the same run.

    python bench/bench_service.py [--n 1000000] [--batch 256] [--steps 30] [--redis-url URL] [--create-n 10000000]

Starts a real service (embedded Valkey by default, or --redis-url), creates a dataset of N prompts, and
runs `steps` training steps of: observe B results (K = 8) -> select INSIGHT over the whole dataset at the
open step (candidate_ratio null: the dataset's score buffer) -> select DPS at the next step (which closes
the step: a DPS update of every prompt observed so far, and a select over the observed set plus the
never-observed block). Reports p50/p90 of each against the p50 of `np.argpartition(x, N - B)` over N
float64 (the floor of any whole-dataset top-k), timed after every step so that both see the same load
on a shared machine. Targets: DPS with close <= 2x, INSIGHT <= 1.5x,
observe <= 1x; creating a 10^7-prompt dataset < 10 s. Prints a table and one JSON line last; `store`
says which store the figures come from (the embedded Valkey fsyncs every write: observe is slower there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.utils import ServiceProcess


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def argpartition_floor(n: int, b: int, repeats: int = 30) -> float:
    rng = np.random.default_rng(0)
    x = rng.random(n)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.argpartition(x, n - b)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--redis-url", default=None)
    ap.add_argument(
        "--create-n", type=int, default=10_000_000, help="size for the create-time figure (0 = skip)"
    )
    ap.add_argument("--out", default="bench/out/service.json")
    args = ap.parse_args()

    svc = ServiceProcess(
        redis_url=args.redis_url, data_dir=None if args.redis_url else tempfile.mkdtemp()
    ).start()
    rng = np.random.default_rng(1)
    name = f"bench-{os.getpid()}"
    timings: dict[str, list[float]] = {"observe": [], "select_insight": [], "select_dps_close": []}
    yardstick = np.random.default_rng(0).random(args.n)
    floors: list[float] = []  # argpartition timed after every step, under the same load as the requests
    try:
        with httpx.Client(base_url=svc.url, timeout=300) as c:
            c.post("/datasets", json={"name": name, "size": args.n, "hmm_decay": 0.7}).raise_for_status()
            c.post("/select", json={"dataset": name, "step": 0, "batch_size": args.batch, "strategy": "dps"})
            for step in range(args.steps):
                ids = rng.choice(args.n, args.batch, replace=False)
                results = [{"prompt_id": int(i), "rewards": rng.integers(0, 2, 8).tolist()} for i in ids]
                body = {"dataset": name, "step": step, "request_id": f"b{step}", "results": results}
                for key, method, payload in [
                    ("observe", "/observe", body),
                    (
                        "select_insight",
                        "/select",
                        {
                            "dataset": name,
                            "step": step,
                            "batch_size": args.batch,
                            "strategy": "insight",
                            "params": {"candidate_ratio": None},
                        },
                    ),
                    (
                        "select_dps_close",
                        "/select",
                        {"dataset": name, "step": step + 1, "batch_size": args.batch, "strategy": "dps"},
                    ),
                ]:
                    t0 = time.perf_counter()
                    r = c.post(method, json=payload)
                    dt = time.perf_counter() - t0
                    r.raise_for_status()
                    if step >= 2:  # the first steps compile kernels and fill caches
                        timings[key].append(dt)
                if step >= 2:
                    t0 = time.perf_counter()
                    np.argpartition(yardstick, args.n - args.batch)
                    floors.append(time.perf_counter() - t0)
            c.delete(f"/datasets/{name}")
            create_s = None
            if args.create_n:
                big = f"{name}-big"
                t0 = time.perf_counter()
                c.post("/datasets", json={"name": big, "size": args.create_n}).raise_for_status()
                create_s = time.perf_counter() - t0
                c.delete(f"/datasets/{big}")
    finally:
        svc.stop()

    floor = statistics.median(floors)
    out_floor_after = argpartition_floor(args.n, args.batch)
    targets = {"observe": 1.0, "select_insight": 1.5, "select_dps_close": 2.0}
    out = {
        "n": args.n,
        "batch": args.batch,
        "cores": os.cpu_count(),
        "argpartition_p50_ms": floor * 1e3,  # interleaved with the steps
        "argpartition_after_p50_ms": out_floor_after * 1e3,  # measured alone after the service stopped
        "store": "redis" if args.redis_url else "embedded-valkey",
    }
    print(f"cores={os.cpu_count()} N={args.n} B={args.batch} argpartition p50 = {floor * 1e3:.2f} ms")
    print(f"{'endpoint':<18}{'p50 ms':>10}{'p90 ms':>10}{'ratio':>8}{'target':>8}")
    for key, xs in timings.items():
        p50, p90 = pct(xs, 50), pct(xs, 90)
        out[f"{key}_p50_ms"] = p50 * 1e3
        out[f"{key}_p90_ms"] = p90 * 1e3
        out[f"{key}_ratio"] = p50 / floor
        print(f"{key:<18}{p50 * 1e3:>10.2f}{p90 * 1e3:>10.2f}{p50 / floor:>8.2f}{targets[key]:>8.1f}")
    if create_s is not None:
        out["create_n"] = args.create_n
        out["create_s"] = create_s
        print(f"create dataset of {args.create_n} prompts: {create_s:.2f} s (target < 10 s)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
