"""Bounded load test of the service: several simulated trainers plus readers, for a fixed duration.

    python bench/load_test.py [--duration 120] [--trainers 4] [--readers 2] [--store redis|embedded]

Each trainer thread runs training steps against two datasets: its own (select -> observe, one step per
iteration) and one shared by all trainers, which they drive like the data-parallel ranks of one run
(every rank selects the same step with the same seed, observes its slice of the batch under its own
request id, then all ranks move to the next step together). Reader threads fetch beliefs of random
prompts and scrape /metrics once a second, as a dashboard and Prometheus would.

Reports requests/s and p50/p99 latency per endpoint, the error count (any non-2xx answer or transport
error; it must be 0), the service's resident memory (psutil on its pid) after warm-up and at the end,
and, on the private Redis the default store starts, the length of every dataset's log against the
snapshot bound (SELECTOR_SNAPSHOT_EVERY_RECORDS). Prints a table, then one JSON line last; the JSON
also goes to bench/out/load.json. Exits 1 when a criterion fails (errors, memory growth, log length).
Loopback only; the service and its store are private to this run.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import OUT_DIR, add_out, emit, percentile, rss
from tests.utils import RedisServer, ServiceProcess

ENDPOINTS = ["select_own", "observe_own", "select_shared", "observe_shared", "beliefs", "metrics"]


class Recorder:
    """Latencies and errors per endpoint, shared by all threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.samples: list[str] = []
        self.recording = False

    def call(self, client: httpx.Client, key: str, method: str, path: str, **kwargs) -> httpx.Response | None:
        t0 = time.perf_counter()
        try:
            response = client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            self._error(key, f"{key}: {type(exc).__name__}: {exc}")
            return None
        elapsed = time.perf_counter() - t0
        if not response.is_success:
            self._error(key, f"{key}: HTTP {response.status_code}: {response.text[:200]}")
            return None
        if self.recording:
            with self.lock:
                self.latencies[key].append(elapsed)
        return response

    def _error(self, key: str, message: str) -> None:
        with self.lock:
            self.errors[key] += 1
            if len(self.samples) < 10:
                self.samples.append(message)


class SharedRun:
    """The shared dataset's step, advanced together by all trainers (like the ranks of one run)."""

    def __init__(self, trainers: int, deadline: float) -> None:
        self.step = 0
        self.stop = False
        self.deadline = deadline
        self.barrier = threading.Barrier(trainers, action=self._advance)

    def _advance(self) -> None:
        self.step += 1
        self.stop = time.monotonic() >= self.deadline


def trainer(
    url: str,
    rank: int,
    ranks: int,
    own: str,
    shared: str,
    run: SharedRun,
    args: argparse.Namespace,
    rec: Recorder,
    steps_done: list[int],
) -> None:
    rng = random.Random(rank)
    k = args.rollouts
    strategies = ["insight", "dps", "mopps", "expected_difficulty"]
    with httpx.Client(base_url=url, timeout=60) as c:
        step = 0
        while not run.stop:
            strategy = strategies[step % len(strategies)]
            sel = rec.call(
                c,
                "select_own",
                "POST",
                "/select",
                json={"dataset": own, "step": step, "batch_size": args.batch, "strategy": strategy},
            )
            if sel is not None:
                results = [
                    {"prompt_id": p, "rewards": [float(rng.random() < 0.4) for _ in range(k)]}
                    for p in sel.json()["prompt_ids"]
                ]
                body = {"dataset": own, "step": step, "request_id": f"{own}-{step}", "results": results}
                rec.call(c, "observe_own", "POST", "/observe", json=body)
            s = run.step
            sel = rec.call(
                c,
                "select_shared",
                "POST",
                "/select",
                json={"dataset": shared, "step": s, "batch_size": args.batch, "strategy": "dps", "seed": s},
            )
            if sel is not None:
                mine = sel.json()["prompt_ids"][rank::ranks]
                results = [{"prompt_id": p, "successes": rng.randint(0, k), "trials": k} for p in mine]
                body = {"dataset": shared, "step": s, "request_id": f"shared-{s}-r{rank}", "results": results}
                rec.call(c, "observe_shared", "POST", "/observe", json=body)
            step += 1
            steps_done[rank] = step
            run.barrier.wait()


def reader(
    url: str, seed: int, names: list[str], sizes: dict[str, int], stop: threading.Event, rec: Recorder
) -> None:
    rng = random.Random(1000 + seed)
    next_scrape = 0.0
    with httpx.Client(base_url=url, timeout=60) as c:
        while not stop.is_set():
            name = rng.choice(names)
            ids = rng.sample(range(sizes[name]), 256)
            rec.call(
                c, "beliefs", "GET", f"/datasets/{name}/beliefs", params={"ids": ",".join(map(str, ids))}
            )
            if time.monotonic() >= next_scrape:
                rec.call(c, "metrics", "GET", "/metrics")
                next_scrape = time.monotonic() + 1.0
            stop.wait(0.02)


def rss_mb(pid: int) -> float:
    return rss(pid) / 2**20


@dataclass
class Measured:
    """What the measured part of the run saw."""

    seconds: float
    steps: int  # trainer steps, all trainers together
    rss_series: list[tuple[float, float]]  # (seconds into the measured run, service RSS in MiB)
    rss_after: float  # MiB once every thread stopped


def main() -> int:
    args = parse_args()
    server = RedisServer(appendonly=True).start() if args.store == "redis" else None
    data_dir = server.dir if server else tempfile.mkdtemp(prefix="rlvr-load-")
    env = {"SELECTOR_SNAPSHOT_EVERY_RECORDS": str(args.snapshot_every)}
    svc = ServiceProcess(
        redis_url=server.url if server else None, data_dir=None if server else data_dir, env=env
    ).start()
    rec = Recorder()
    own = [f"own-{r}" for r in range(args.trainers)]
    names = [*own, "shared"]
    try:
        create_datasets(svc.url, names, args)
        measured = drive(svc, own, "shared", args, rec)
        log_lengths, redis_mb = store_figures(server, svc.prefix, names)
    finally:
        svc.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)

    print(
        f"{args.trainers} trainers, {args.readers} readers, {measured.seconds:.0f} s measured, store={args.store}"
    )
    rows = endpoint_table(rec, measured.seconds)
    out = summary(args, rec, rows, measured, log_lengths, redis_mb)
    for message in rec.samples:
        print("error:", message)
    failures = verdict(args, out)
    out["passed"] = not failures
    emit(out, Path(args.out))
    return 0 if not failures else 1


def create_datasets(url: str, names: list[str], args: argparse.Namespace) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        for name in names:
            body = {"name": name, "size": args.size, "rollouts_per_prompt": args.rollouts}
            c.post("/datasets", json=body).raise_for_status()


def drive(
    svc: ServiceProcess, own: list[str], shared: str, args: argparse.Namespace, rec: Recorder
) -> Measured:
    """Trainers and readers for --warmup + --duration seconds; latencies are recorded after the warm-up,
    the service's RSS once a second."""
    names = [*own, shared]
    sizes = dict.fromkeys(names, args.size)
    run = SharedRun(args.trainers, deadline=time.monotonic() + args.warmup + args.duration)
    steps_done = [0] * args.trainers
    stop_readers = threading.Event()
    trainers = [
        threading.Thread(
            target=trainer, args=(svc.url, r, args.trainers, own[r], shared, run, args, rec, steps_done)
        )
        for r in range(args.trainers)
    ]
    readers = [
        threading.Thread(target=reader, args=(svc.url, i, names, sizes, stop_readers, rec))
        for i in range(args.readers)
    ]
    for thread in trainers + readers:
        thread.start()
    time.sleep(args.warmup)
    steps_before = sum(steps_done)
    rec.recording = True
    t_measure = time.monotonic()
    rss_series = [(0.0, rss_mb(svc.proc.pid))]
    while any(t.is_alive() for t in trainers):
        time.sleep(1.0)
        rss_series.append((time.monotonic() - t_measure, rss_mb(svc.proc.pid)))
    seconds = time.monotonic() - t_measure
    rec.recording = False
    stop_readers.set()
    for thread in trainers + readers:
        thread.join()
    return Measured(seconds, sum(steps_done) - steps_before, rss_series, rss_mb(svc.proc.pid))


def store_figures(
    server: RedisServer | None, prefix: str, names: list[str]
) -> tuple[dict[str, int], float | None]:
    """Every dataset's log length and Redis's memory, on the private Redis (none on the embedded store)."""
    if server is None:
        return {}, None
    r = redis.Redis.from_url(server.url)
    try:
        log_lengths = {n: r.xlen(f"{prefix}:v1:{{{n}}}:log") for n in names}
        return log_lengths, r.info("memory")["used_memory"] / 2**20
    finally:
        r.close()


def endpoint_table(rec: Recorder, seconds: float) -> dict[str, dict[str, Any]]:
    print(f"{'endpoint':<16}{'requests':>10}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'errors':>8}")
    rows = {}
    for key in ENDPOINTS:
        xs = [x * 1e3 for x in rec.latencies.get(key, [])] or [0.0]
        n = len(rec.latencies.get(key, []))
        row = rows[key] = {
            "requests": n,
            "per_s": n / seconds,
            "p50_ms": percentile(xs, 50),
            "p99_ms": percentile(xs, 99),
            "max_ms": float(max(xs)),
            "errors": rec.errors.get(key, 0),
        }
        print(
            f"{key:<16}{n:>10}{row['per_s']:>9.1f}{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}"
            f"{row['max_ms']:>9.1f}{row['errors']:>8}"
        )
    return rows


def summary(
    args: argparse.Namespace,
    rec: Recorder,
    rows: dict[str, dict[str, Any]],
    measured: Measured,
    log_lengths: dict[str, int],
    redis_mb: float | None,
) -> dict[str, Any]:
    total, seconds = sum(r["requests"] for r in rows.values()), measured.seconds
    rss_before, rss_after = measured.rss_series[0][1], measured.rss_after
    # A leak keeps growing; allocator warm-up levels off. Compare the two halves of the run.
    rss_mid = min(measured.rss_series, key=lambda point: abs(point[0] - seconds / 2))[1]
    rss_peak = max(mb for _, mb in measured.rss_series)
    print(
        f"total {total} requests, {total / seconds:.1f} req/s, {measured.steps / seconds:.2f} trainer steps/s"
    )
    print(
        f"service RSS: {rss_before:.1f} MiB after warm-up, {rss_mid:.1f} MiB half-way, {rss_after:.1f} MiB at "
        f"the end (peak {rss_peak:.1f}; +{rss_after - rss_mid:.1f} MiB in the second half)"
    )
    if log_lengths:
        print(
            f"longest dataset log: {max(log_lengths.values())} records (snapshot every {args.snapshot_every}); "
            f"redis {redis_mb:.1f} MiB"
        )
    return {
        "duration_s": seconds,
        "trainers": args.trainers,
        "readers": args.readers,
        "size": args.size,
        "batch": args.batch,
        "store": args.store,
        "cores": psutil.cpu_count(),
        "requests": total,
        "requests_per_s": total / seconds,
        "trainer_steps_per_s": measured.steps / seconds,
        "errors": sum(rec.errors.values()),
        "endpoints": rows,
        "rss_mb_before": rss_before,
        "rss_mb_after": rss_after,
        "rss_mb_peak": rss_peak,
        "rss_growth_mb": rss_after - rss_before,
        "rss_mb_halfway": rss_mid,
        "rss_growth_second_half_mb": rss_after - rss_mid,
        "log_lengths": log_lengths,
        # A snapshot starts once the log holds `snapshot_every` records and trims what it covers; the
        # records written while it is taken stay, so twice the setting bounds the log.
        "log_bound": 2 * args.snapshot_every if log_lengths else None,
        "redis_used_mb": redis_mb,
    }


def verdict(args: argparse.Namespace, out: dict[str, Any]) -> list[str]:
    """The criteria: no errors, bounded RSS growth, bounded logs. Prints PASS or what failed."""
    failures = []
    if out["errors"]:
        failures.append(f"{out['errors']} errors")
    if out["rss_growth_mb"] > args.max_rss_growth_mb:
        failures.append(f"RSS grew {out['rss_growth_mb']:.1f} MiB (> {args.max_rss_growth_mb})")
    longest = max(out["log_lengths"].values()) if out["log_lengths"] else None
    if longest is not None and longest > out["log_bound"]:
        failures.append(f"a dataset log holds {longest} records (> {out['log_bound']})")
    print("PASS" if not failures else "FAIL: " + "; ".join(failures))
    return failures


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of measured load (default 120)")
    ap.add_argument(
        "--warmup", type=float, default=10.0, help="seconds of unmeasured load first (default 10)"
    )
    ap.add_argument("--trainers", type=int, default=4, help="trainer threads (default 4)")
    ap.add_argument("--readers", type=int, default=2, help="reader threads (default 2)")
    ap.add_argument("--size", type=int, default=20_000, help="prompts per dataset (default 20000)")
    ap.add_argument("--batch", type=int, default=64, help="prompts per select (default 64)")
    ap.add_argument("--rollouts", type=int, default=8, help="rollouts per prompt, K (default 8)")
    ap.add_argument(
        "--store",
        choices=["redis", "embedded"],
        default="redis",
        help="private redis-server or embedded Valkey",
    )
    ap.add_argument(
        "--snapshot-every", type=int, default=500, help="SELECTOR_SNAPSHOT_EVERY_RECORDS (default 500)"
    )
    ap.add_argument(
        "--max-rss-growth-mb", type=float, default=64.0, help="allowed RSS growth, MiB (default 64)"
    )
    add_out(ap, OUT_DIR / "load.json")
    return ap.parse_args()


if __name__ == "__main__":
    sys.exit(main())
