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
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
import numpy as np
import psutil
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import RedisServer, ServiceProcess

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
    return psutil.Process(pid).memory_info().rss / 2**20


def main() -> int:
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
    ap.add_argument("--out", default="bench/out/load.json")
    args = ap.parse_args()

    server = RedisServer(appendonly=True).start() if args.store == "redis" else None
    data_dir = server.dir if server else tempfile.mkdtemp(prefix="rlvr-load-")
    env = {"SELECTOR_SNAPSHOT_EVERY_RECORDS": str(args.snapshot_every)}
    svc = ServiceProcess(
        redis_url=server.url if server else None, data_dir=None if server else data_dir, env=env
    ).start()
    rec = Recorder()
    own = [f"own-{r}" for r in range(args.trainers)]
    shared = "shared"
    names = [*own, shared]
    sizes = dict.fromkeys(names, args.size)
    try:
        with httpx.Client(base_url=svc.url, timeout=60) as c:
            for name in names:
                c.post(
                    "/datasets", json={"name": name, "size": args.size, "rollouts_per_prompt": args.rollouts}
                ).raise_for_status()
        start = time.monotonic()
        run = SharedRun(args.trainers, deadline=start + args.warmup + args.duration)
        steps_done = [0] * args.trainers
        stop_readers = threading.Event()
        threads = [
            threading.Thread(
                target=trainer, args=(svc.url, r, args.trainers, own[r], shared, run, args, rec, steps_done)
            )
            for r in range(args.trainers)
        ] + [
            threading.Thread(target=reader, args=(svc.url, i, names, sizes, stop_readers, rec))
            for i in range(args.readers)
        ]
        for t in threads:
            t.start()
        time.sleep(args.warmup)
        rss_before = rss_mb(svc.proc.pid)
        steps_before = sum(steps_done)
        rec.recording = True
        t_measure = time.monotonic()
        rss_series = [(0.0, rss_before)]  # (seconds into the measured run, MiB)
        while any(t.is_alive() for t in threads[: args.trainers]):
            time.sleep(1.0)
            rss_series.append((time.monotonic() - t_measure, rss_mb(svc.proc.pid)))
        measured_s = time.monotonic() - t_measure
        rec.recording = False
        stop_readers.set()
        for t in threads:
            t.join()
        rss_after = rss_mb(svc.proc.pid)
        steps = sum(steps_done) - steps_before
        log_lengths = {}
        if server is not None:
            r = redis.Redis.from_url(server.url)
            log_lengths = {n: r.xlen(f"{svc.prefix}:v1:{{{n}}}:log") for n in names}
            redis_mb = r.info("memory")["used_memory"] / 2**20
            r.close()
        else:
            redis_mb = None
    finally:
        svc.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)

    total_errors = sum(rec.errors.values())
    rows = {}
    print(
        f"{args.trainers} trainers, {args.readers} readers, {measured_s:.0f} s measured, store={args.store}"
    )
    print(f"{'endpoint':<16}{'requests':>10}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'errors':>8}")
    for key in ENDPOINTS:
        xs = np.asarray(rec.latencies.get(key, [0.0])) * 1e3
        n = len(rec.latencies.get(key, []))
        rows[key] = {
            "requests": n,
            "per_s": n / measured_s,
            "p50_ms": float(np.percentile(xs, 50)),
            "p99_ms": float(np.percentile(xs, 99)),
            "max_ms": float(xs.max()),
            "errors": rec.errors.get(key, 0),
        }
        row = rows[key]
        print(
            f"{key:<16}{n:>10}{row['per_s']:>9.1f}{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}"
            f"{row['max_ms']:>9.1f}{row['errors']:>8}"
        )
    total = sum(r["requests"] for r in rows.values())
    growth = rss_after - rss_before
    rss_peak = max(mb for _, mb in rss_series)
    # A leak keeps growing; allocator warm-up levels off. Compare the two halves of the run.
    half = measured_s / 2
    rss_mid = min(rss_series, key=lambda point: abs(point[0] - half))[1]
    growth_second_half = rss_after - rss_mid
    # A snapshot starts once the log holds `snapshot_every` records and trims what it covers; the records
    # written while it is taken stay, so twice the setting bounds the log.
    log_bound = 2 * args.snapshot_every
    longest_log = max(log_lengths.values()) if log_lengths else None
    print(f"total {total} requests, {total / measured_s:.1f} req/s, {steps / measured_s:.2f} trainer steps/s")
    print(
        f"service RSS: {rss_before:.1f} MiB after warm-up, {rss_mid:.1f} MiB half-way, {rss_after:.1f} MiB at "
        f"the end (peak {rss_peak:.1f}; +{growth_second_half:.1f} MiB in the second half)"
    )
    if longest_log is not None:
        print(
            f"longest dataset log: {longest_log} records (snapshot every {args.snapshot_every}); redis {redis_mb:.1f} MiB"
        )
    for message in rec.samples:
        print("error:", message)
    failures = []
    if total_errors:
        failures.append(f"{total_errors} errors")
    if growth > args.max_rss_growth_mb:
        failures.append(f"RSS grew {growth:.1f} MiB (> {args.max_rss_growth_mb})")
    if longest_log is not None and longest_log > log_bound:
        failures.append(f"a dataset log holds {longest_log} records (> {log_bound})")
    print("PASS" if not failures else "FAIL: " + "; ".join(failures))
    out = {
        "duration_s": measured_s,
        "trainers": args.trainers,
        "readers": args.readers,
        "size": args.size,
        "batch": args.batch,
        "store": args.store,
        "cores": psutil.cpu_count(),
        "requests": total,
        "requests_per_s": total / measured_s,
        "trainer_steps_per_s": steps / measured_s,
        "errors": total_errors,
        "endpoints": rows,
        "rss_mb_before": rss_before,
        "rss_mb_after": rss_after,
        "rss_mb_peak": rss_peak,
        "rss_growth_mb": growth,
        "rss_mb_halfway": rss_mid,
        "rss_growth_second_half_mb": growth_second_half,
        "log_lengths": log_lengths,
        "log_bound": log_bound if log_lengths else None,
        "redis_used_mb": redis_mb,
        "passed": not failures,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
