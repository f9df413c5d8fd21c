"""Service latency over HTTP, as ratios to numpy.argpartition over N floats measured in the same run.

    python bench/bench_service.py [--n 1000000] [--batch 256] [--steps 30] [--observed 0.0] [--redis-url URL]
                                  [--create-n 10000000] [--rollouts-batch 1024] [--rollouts-budget 16384]
                                  [--rollouts-max 64] [--rollouts-steps 30]

Starts a real service (embedded Valkey by default, or --redis-url), creates a dataset of N prompts, and
runs `steps` training steps of: observe B results (K = 8) -> select INSIGHT over the whole dataset at the
open step (candidate_ratio null: the dataset's score buffer) -> select DPS at the next step (which closes
the step: a DPS update of every prompt observed so far, and a select over the observed set plus the
never-observed block). `--observed f` first reports results for a share f of the prompts, so that the
selects also rank that many observed prompts. Reports p50/p90 of each against the p50 of `np.argpartition(x, N - B)` over N
float64 (the floor of any whole-dataset top-k), timed after every step so that both see the same load
on a shared machine. Targets: DPS with close <= 2x, INSIGHT <= 1.5x,
observe <= 1x; creating a 10^7-prompt dataset < 10 s. Prints a table and one JSON line last; `store`
says which store the figures come from (the embedded Valkey fsyncs every write: observe is slower there).

Then the cost of a rollout budget (docs/methods.md §8), at B = --rollouts-batch prompts, a budget of
--rollouts-budget rollouts, counts in [1, --rollouts-max]: each policy's allocation in-process
(core.allocate_rollouts on B Beta beliefs, half of them observed, half cold priors; median of 200 calls;
target < 2 ms), and over HTTP an INSIGHT select of B prompts (the same dataset, the default pool of
16 B candidates) with a budget of each policy against the same select without one, the requests
interleaved so all see the same load, each variant first in turn (target: p50 ratio < 2x).
`--rollouts-batch 0` skips it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import OUT_DIR, ROOT, add_out, argpartition_seconds, emit, percentile, timed
from selector_service.core import ROLLOUT_POLICIES, allocate_rollouts, stream
from selector_service.launcher import ServiceProcess

TARGETS = {"observe": 1.0, "select_insight": 1.5, "select_dps_close": 2.0}
WARMUP_STEPS = 2  # the first steps compile kernels and fill caches
ALLOCATION_TARGET_MS = 2.0
BUDGET_RATIO_TARGET = 2.0
ALLOCATION_CALLS = 200


def main() -> None:
    args = parse_args()
    data_dir = None if args.redis_url else tempfile.mkdtemp()
    env = {"SELECTOR_KEY_PREFIX": f"bench-service-{os.getpid()}"}  # private keys on a shared Redis
    svc = ServiceProcess(redis_url=args.redis_url, data_dir=data_dir, env=env, cwd=ROOT).start()
    try:
        with httpx.Client(base_url=svc.url, timeout=300) as client:
            timings, floors = run_steps(client, f"bench-{os.getpid()}", args)
            budget = (
                run_rollouts(client, f"bench-{os.getpid()}-budget", args) if args.rollouts_batch else None
            )
            create_s = (
                time_create(client, f"bench-{os.getpid()}-big", args.create_n) if args.create_n else None
            )
    finally:
        svc.stop()

    floor = statistics.median(floors)
    out: dict[str, Any] = {
        "n": args.n,
        "batch": args.batch,
        "observed": args.observed,
        "cores": os.cpu_count(),
        "argpartition_p50_ms": floor * 1e3,  # interleaved with the steps
        "argpartition_after_p50_ms": argpartition_seconds(args.n, args.batch) * 1e3,  # alone, service stopped
        "store": "redis" if args.redis_url else "embedded-valkey",
    }
    print(f"cores={os.cpu_count()} N={args.n} B={args.batch} argpartition p50 = {floor * 1e3:.2f} ms")
    print(f"{'endpoint':<18}{'p50 ms':>10}{'p90 ms':>10}{'ratio':>8}{'target':>8}")
    for key, xs in timings.items():
        p50, p90 = percentile(xs, 50), percentile(xs, 90)
        out[f"{key}_p50_ms"] = p50 * 1e3
        out[f"{key}_p90_ms"] = p90 * 1e3
        out[f"{key}_ratio"] = p50 / floor
        print(f"{key:<18}{p50 * 1e3:>10.2f}{p90 * 1e3:>10.2f}{p50 / floor:>8.2f}{TARGETS[key]:>8.1f}")
    if budget is not None:
        out.update(budget)
        print(
            f"rollout budget: B={args.rollouts_batch} budget={args.rollouts_budget} max={args.rollouts_max}"
        )
        print(f"{'policy':<12}{'alloc ms':>10}{'select ms':>11}{'without':>10}{'ratio':>8}")
        for policy in ROLLOUT_POLICIES:
            print(
                f"{policy:<12}{budget[f'allocate_{policy}_ms']:>10.3f}"
                f"{budget[f'select_budget_{policy}_p50_ms']:>11.2f}"
                f"{budget['select_no_budget_p50_ms']:>10.2f}{budget[f'select_budget_{policy}_ratio']:>8.2f}"
            )
        print(
            f"targets: allocation < {ALLOCATION_TARGET_MS} ms, select with / without < {BUDGET_RATIO_TARGET}x"
        )
    if create_s is not None:
        out["create_n"] = args.create_n
        out["create_s"] = create_s
        print(f"create dataset of {args.create_n} prompts: {create_s:.2f} s (target < 10 s)")
    emit(out, args.out)


def run_steps(
    client: httpx.Client, name: str, args: argparse.Namespace
) -> tuple[dict[str, list[float]], list[float]]:
    """`steps` training steps of observe -> INSIGHT select at the open step -> DPS select that closes it;
    the seconds of each request after the warm-up steps, and np.argpartition over N floats timed after
    every step, under the same load as the requests."""
    rng = np.random.default_rng(1)
    yardstick = np.random.default_rng(0).random(args.n)
    timings: dict[str, list[float]] = {key: [] for key in TARGETS}
    floors: list[float] = []
    client.post("/datasets", json={"name": name, "size": args.n, "hmm_decay": 0.7}).raise_for_status()
    client.post("/select", json={"dataset": name, "step": 0, "batch_size": args.batch, "strategy": "dps"})
    observe_share(client, name, args.n, args.observed, rng)
    for step in range(args.steps):
        ids = rng.choice(args.n, args.batch, replace=False)
        results = [{"prompt_id": int(i), "rewards": rng.integers(0, 2, 8).tolist()} for i in ids]
        select = {"dataset": name, "batch_size": args.batch}
        requests = {
            "observe": (
                "/observe",
                {"dataset": name, "step": step, "request_id": f"b{step}", "results": results},
            ),
            "select_insight": (
                "/select",
                {**select, "step": step, "strategy": "insight", "params": {"candidate_ratio": None}},
            ),
            "select_dps_close": ("/select", {**select, "step": step + 1, "strategy": "dps"}),
        }
        for key, (path, payload) in requests.items():
            t0 = time.perf_counter()
            response = client.post(path, json=payload)
            dt = time.perf_counter() - t0
            response.raise_for_status()
            if step >= WARMUP_STEPS:
                timings[key].append(dt)
        if step >= WARMUP_STEPS:
            t0 = time.perf_counter()
            np.argpartition(yardstick, args.n - args.batch)
            floors.append(time.perf_counter() - t0)
    client.delete(f"/datasets/{name}")
    return timings, floors


def allocation_ms(batch: int, budget: int, top: int) -> dict[str, float]:
    """Median milliseconds of core.allocate_rollouts per policy on `batch` Beta beliefs: half observed
    (8 to 200 rollouts at a random pass rate), half the cold prior Beta(1, 1)."""
    rng = np.random.default_rng(7)
    trials = rng.integers(8, 200, batch)
    successes = rng.binomial(trials, rng.uniform(0, 1, batch))
    cold = rng.random(batch) < 0.5
    alpha = np.where(cold, 1.0, 1.0 + successes)
    beta = np.where(cold, 1.0, 1.0 + trials - successes)
    ids = rng.permutation(10 * batch)[:batch]
    tie = stream("bench", 0, 0, "rollouts")
    out = {}
    for policy in ROLLOUT_POLICIES:
        kw = dict(budget=budget, min_rollouts=1, max_rollouts=top, policy=policy, rng=tie)
        seconds = timed(lambda kw=kw: allocate_rollouts(alpha, beta, ids, **kw), ALLOCATION_CALLS)
        out[f"allocate_{policy}_ms"] = seconds * 1e3
    return out


def run_rollouts(client: httpx.Client, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The rollout budget's cost: allocation per policy in-process, and /select (INSIGHT, B prompts) with
    a budget of each policy against the same select without one, interleaved."""
    batch, budget, top = args.rollouts_batch, args.rollouts_budget, args.rollouts_max
    out: dict[str, Any] = {"rollouts_batch": batch, "rollouts_budget": budget, "rollouts_max": top}
    out.update(allocation_ms(batch, budget, top))
    size = max(args.n, 4 * batch)
    client.post("/datasets", json={"name": name, "size": size}).raise_for_status()
    rng = np.random.default_rng(3)
    observe_share(client, name, size, min(1.0, 16 * batch / size), rng)  # the pools hold observed prompts
    select = {"dataset": name, "step": 0, "batch_size": batch, "strategy": "insight"}
    bodies = {"no_budget": select}
    for policy in ROLLOUT_POLICIES:
        rollouts = {"budget": budget, "min": 1, "max": top, "policy": policy}
        bodies[f"budget_{policy}"] = {**select, "rollouts": rollouts}
    samples: dict[str, list[float]] = {key: [] for key in bodies}
    keys = list(bodies)
    for round_ in range(args.rollouts_steps + WARMUP_STEPS):
        start = round_ % len(keys)  # each variant goes first in turn: no variant always follows another
        for key in keys[start:] + keys[:start]:
            body = {**bodies[key], "seed": round_}  # another pool every round, the same for every variant
            t0 = time.perf_counter()
            response = client.post("/select", json=body)
            dt = time.perf_counter() - t0
            response.raise_for_status()
            if key != "no_budget":
                assert sum(response.json()["rollouts"]) == budget
            if round_ >= WARMUP_STEPS:
                samples[key].append(dt)
    client.delete(f"/datasets/{name}")
    plain = percentile(samples["no_budget"], 50)
    out["select_no_budget_p50_ms"] = plain * 1e3
    for policy in ROLLOUT_POLICIES:
        p50 = percentile(samples[f"budget_{policy}"], 50)
        out[f"select_budget_{policy}_p50_ms"] = p50 * 1e3
        out[f"select_budget_{policy}_ratio"] = p50 / plain
    return out


def observe_share(client: httpx.Client, name: str, n: int, share: float, rng: np.random.Generator) -> None:
    """Results at step 0 for round(share * n) distinct prompts, in requests of 4096."""
    ids = rng.permutation(n)[: round(share * n)]
    for start in range(0, ids.size, 4096):
        chunk = ids[start : start + 4096]
        rewards = rng.integers(0, 2, (chunk.size, 8)).tolist()
        results = [{"prompt_id": int(i), "rewards": r} for i, r in zip(chunk, rewards, strict=True)]
        body = {"dataset": name, "step": 0, "request_id": f"{name}-pre{start}", "results": results}
        client.post("/observe", json=body).raise_for_status()


def time_create(client: httpx.Client, name: str, n: int) -> float:
    t0 = time.perf_counter()
    client.post("/datasets", json={"name": name, "size": n}).raise_for_status()
    seconds = time.perf_counter() - t0
    client.delete(f"/datasets/{name}")
    return seconds


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="prompts in the dataset")
    ap.add_argument("--batch", type=int, default=256, help="prompts per select (B)")
    ap.add_argument("--steps", type=int, default=30, help="training steps (the first 2 are not timed)")
    ap.add_argument(
        "--observed", type=float, default=0.0, help="share of the prompts observed before the timed steps"
    )
    ap.add_argument("--redis-url", default=None, help="a Redis to use instead of the embedded Valkey")
    ap.add_argument(
        "--create-n", type=int, default=10_000_000, help="size for the create-time figure (0 = skip)"
    )
    ap.add_argument(
        "--rollouts-batch", type=int, default=1024, help="prompts per select with a rollout budget (0 = skip)"
    )
    ap.add_argument("--rollouts-budget", type=int, default=16384, help="rollouts of that select in all")
    ap.add_argument("--rollouts-max", type=int, default=64, help="most rollouts of one prompt")
    ap.add_argument(
        "--rollouts-steps", type=int, default=30, help="timed rounds of the budget selects (after 2 warm-up)"
    )
    add_out(ap, OUT_DIR / "service.json")
    args = ap.parse_args()
    if args.rollouts_batch and not (
        args.rollouts_batch <= args.rollouts_budget <= args.rollouts_batch * args.rollouts_max
    ):
        ap.error("--rollouts-budget must lie in [--rollouts-batch, --rollouts-batch x --rollouts-max]")
    if not 0.0 <= args.observed <= 1.0:
        ap.error(f"--observed must lie in [0, 1], got {args.observed}")
    if args.steps <= WARMUP_STEPS:
        ap.error(f"--steps must be > {WARMUP_STEPS} (the first {WARMUP_STEPS} are not timed)")
    return args


if __name__ == "__main__":
    main()
