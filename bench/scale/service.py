"""Part 3 of bench/bench_scale.py: a real service process on a private Redis at 10^7 prompts: create,
import, steps, the first snapshot, kill -9 and restart (see the script's docstring)."""

from __future__ import annotations

import gc
import math
import os
import threading
import time
from typing import Any

import httpx
import numpy as np
import redis

from bench.common import fmt_n, median, peak_rss, percentile, reset_peak_rss, rss
from bench.scale.kernels import HMM_DECAY, full_beliefs, random_outcomes
from selector_service.core import BeliefArrays
from selector_service.dataset.state import DatasetSpec, DatasetState
from selector_service.replication.replica import REPLAY_BUDGET
from selector_service.storage.snapshot import serialize_snapshot
from selector_service.storage.store import Keys
from tests.utils import RedisServer, ServiceProcess

PAPER_STEP_S_1E7 = 2.4
PAPER_GIB_1E7 = 0.9
#: Memory the service part needs per prompt at its peak, all processes together (measured ~650 B).
SERVICE_BYTES_PER_PROMPT = 700
TARGETS = {"bytes_per_prompt": 128, "service_step_s_1e7": 1.0, "restart_s": 30.0}


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
    return serialize_snapshot(state.snapshot_header(), state.snapshot_arrays())


def service_figures(n: int, batch: int, replay_steps: int, redis_url: str | None) -> dict[str, Any]:
    """The service checks at n prompts; see the script's docstring (part 3)."""
    run = ServiceScaleRun(n, batch, replay_steps, redis_url)
    try:
        run.start()
        run.warm_up()
        run.create_and_import()
        step = run.steps_until_snapshot()
        meta = run.selects_during_snapshot(step)
        step = run.replay_kill_restart(step, meta)
        return run.finish(step)
    finally:
        run.close()


class ServiceScaleRun:
    """One service process (and its replacement after kill -9) on a Redis, driven by a trainer-like
    client; `out` collects the figures phase by phase."""

    def __init__(self, n: int, batch: int, replay_steps: int, redis_url: str | None) -> None:
        max_replay = max(1, math.ceil(REPLAY_BUDGET / n) - 1)  # closes * n must stay below REPLAY_BUDGET
        self.n, self.batch, self.replay_steps = n, batch, min(replay_steps, max_replay)
        # Each step appends 2 log records (observe, advance). The threshold lets the first snapshot come
        # after ~replay_steps + 1 steps and keeps the replay window free of a second one.
        self.records = 2 * self.replay_steps + 4
        self.env = {"SELECTOR_SNAPSHOT_EVERY_RECORDS": str(self.records), "SELECTOR_LOG_LEVEL": "info"}
        self.private = None if redis_url else RedisServer().start()
        self.url = redis_url or self.private.url
        self.prefix, self.name = f"scale{os.getpid()}", "scale"
        self.keys = Keys(self.prefix)
        self.client = redis.Redis.from_url(self.url)
        self.services: list[ServiceProcess] = []
        self.out: dict[str, Any] = {"n": n, "batch": batch, "snapshot_every_records": self.records}
        self.rng = np.random.default_rng(3)
        self.lat: dict[str, list[float]] = {
            "observe": [],
            "select_close": [],
            "select": [],
            "select_insight": [],
        }
        self.watch = SnapshotWatch(self.client, self.keys.snaplock(self.name)).start()
        self.idle = 0

    def start(self) -> None:
        svc = ServiceProcess(redis_url=self.url, prefix=self.prefix, env=self.env).start()
        self.services.append(svc)
        self.pid = svc.proc.pid
        self.http = httpx.Client(base_url=svc.url, timeout=600)

    def close(self) -> None:
        self.watch.stop()
        for svc in self.services:
            svc.kill()
        self.client.close()
        if self.private is not None:
            self.private.stop()

    # -- requests ------------------------------------------------------------------------------------
    def post(self, path: str, body: dict, key: str | None = None, record: bool = False) -> httpx.Response:
        t0 = time.perf_counter()
        resp = self.http.post(path, json=body)
        dt = time.perf_counter() - t0
        resp.raise_for_status()
        if record and key:
            self.lat[key].append(dt)
        return resp

    def select_body(self, step: int, strategy: str = "dps", seed: int = 0, ds: str | None = None) -> dict:
        return {
            "dataset": ds or self.name,
            "step": step,
            "batch_size": self.batch,
            "strategy": strategy,
            "seed": seed,
        }

    def observe_and_close(
        self, step: int, record: bool, ds: str | None = None, size: int | None = None
    ) -> None:
        ds = ds or self.name
        ids, succ, trials, _ = random_outcomes(self.rng, size or self.n, self.batch)
        results = [
            {"prompt_id": int(i), "successes": int(s), "trials": int(k)}
            for i, s, k in zip(ids, succ, trials, strict=True)
        ]
        body = {"dataset": ds, "step": step, "request_id": f"{ds}-s{step}", "results": results}
        self.post("/observe", body, "observe", record)
        self.post("/select", self.select_body(step + 1, ds=ds), "select_close", record)

    def open_selects(self, step: int, record: bool) -> None:
        self.post("/select", self.select_body(step), "select", record)
        self.post("/select", self.select_body(step, "insight"), "select_insight", record)

    def snapshot_id(self) -> bytes | None:
        return self.client.hget(self.keys.meta(self.name), "snap")

    def per_prompt(self, resident: int | None) -> float:
        return ((resident or 0) - self.idle) / self.n

    # -- phases --------------------------------------------------------------------------------------
    def warm_up(self) -> None:
        """A small dataset first, so that the idle RSS includes every loaded kernel."""
        warm, warm_n = "scale-warmup", max(2 * self.batch, 65_536)
        self.post("/datasets", {"name": warm, "size": warm_n, "hmm_decay": HMM_DECAY})
        for step in range(2):
            self.observe_and_close(step, False, ds=warm, size=warm_n)
            self.post("/select", self.select_body(step + 1, "insight", ds=warm))
        self.http.delete(f"/datasets/{warm}").raise_for_status()
        self.idle = rss(self.pid)
        self.out["rss_idle_mb"] = self.idle / 2**20

    def create_and_import(self) -> None:
        """Create (fresh priors), then replace by an import of long-run beliefs."""
        out, name = self.out, self.name
        t = time.perf_counter()
        self.post("/datasets", {"name": name, "size": self.n, "hmm_decay": HMM_DECAY})
        out["create_s"] = time.perf_counter() - t
        out["rss_after_create_bytes_per_prompt"] = self.per_prompt(rss(self.pid))
        self.http.delete(f"/datasets/{name}").raise_for_status()
        blob = export_blob(name, self.n)
        out["import_bytes"] = len(blob)
        t = time.perf_counter()
        self.http.post(f"/datasets/{name}/import", content=blob).raise_for_status()
        out["import_s"] = time.perf_counter() - t
        del blob
        gc.collect()
        reset_peak_rss(self.pid)  # the import's own transient copies are not what a running dataset costs
        out["rss_after_import_bytes_per_prompt"] = self.per_prompt(rss(self.pid))
        self.snap0 = self.snapshot_id()

    def steps_until_snapshot(self) -> int:
        step, warmup = 0, 1
        while True:
            self.observe_and_close(step, record=step >= warmup)
            step += 1
            if self.watch.windows or self.snapshot_id() != self.snap0:
                break
            self.open_selects(step, record=step > warmup)
            if step > self.records:
                raise RuntimeError(
                    f"no snapshot started after {step} steps (threshold {self.records} records)"
                )
        self.out["rss_steady_bytes_per_prompt"] = self.per_prompt(rss(self.pid))
        self.out["rss_peak_before_snapshot_bytes_per_prompt"] = self.per_prompt(peak_rss(self.pid))
        self.out["snapshot_triggered_at_step"] = step
        return step

    def selects_during_snapshot(self, step: int) -> dict[str, str]:
        """/select while the snapshot is written; its size and chunking in Redis. Returns the dataset's
        meta hash after the snapshot."""
        during: list[tuple[float, float]] = []
        deadline = time.perf_counter() + 300
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            self.post("/select", self.select_body(step))
            during.append((t0, time.perf_counter()))
            if not self.watch.holding() and self.snapshot_id() != self.snap0:
                break
        time.sleep(0.05)
        window = self.watch.windows[0] if self.watch.windows else None
        inside = [b - a for a, b in during if window and a <= window[1] and b >= window[0]]
        meta = {k.decode(): v.decode() for k, v in self.client.hgetall(self.keys.meta(self.name)).items()}
        chunk_sizes = [
            int(self.client.strlen(self.keys.snap_chunk(self.name, meta["snap"], i)))
            for i in range(int(meta["snap_chunks"]))
        ]
        self.out["snapshot"] = {
            "write_s": window[1] - window[0] if window else None,
            "chunks": len(chunk_sizes),
            "bytes": sum(chunk_sizes),
            "largest_chunk_bytes": max(chunk_sizes),
            "raw_bytes": self.n * BeliefArrays.new(1).nbytes_per_prompt,
            "covers_step": int(meta["snap_step"]),
            "selects_during": len(inside),
            "select_during_p50_ms": _ms(median(inside)),
            "select_during_max_ms": _ms(max(inside) if inside else None),
        }
        self.out["rss_peak_bytes_per_prompt"] = self.per_prompt(peak_rss(self.pid))
        return meta

    def replay_kill_restart(self, step: int, meta: dict[str, str]) -> int:
        """More steps (the log a restart replays), kill -9, a new process, the time to its first /select
        and whether it returns the batch the killed process did."""
        snap_step = int(meta["snap_step"])
        while step < snap_step + self.replay_steps:
            self.observe_and_close(step, record=True)
            step += 1
            self.open_selects(step, record=True)
        if self.snapshot_id().decode() != meta["snap"]:
            raise RuntimeError("a second snapshot was written during the replay window; lower --replay-steps")
        before = self.post("/select", self.select_body(step, seed=12345)).json()["prompt_ids"]
        self.http.close()
        t_kill = time.perf_counter()
        self.services[0].kill()
        again = ServiceProcess(redis_url=self.url, prefix=self.prefix, env=self.env).start()
        self.services.append(again)
        t_ready = time.perf_counter()
        with httpx.Client(base_url=again.url, timeout=600) as http:
            after = http.post("/select", json=self.select_body(step, seed=12345))
            t_first = time.perf_counter()
            after.raise_for_status()
            t = time.perf_counter()
            http.post("/select", json=self.select_body(step)).raise_for_status()
            second_s = time.perf_counter() - t
            self.out["restart"] = {
                "replayed_closes": step - snap_step,
                "replayed_prompt_updates": (step - snap_step) * self.n,
                "kill_to_ready_s": t_ready - t_kill,
                "first_select_s": t_first - t_ready,
                "kill_to_first_select_s": t_first - t_kill,
                "next_select_ms": second_s * 1e3,
                "same_batch": after.json()["prompt_ids"] == before,
                "rss_bytes_per_prompt": self.per_prompt(rss(again.proc.pid)),
                "peak_bytes_per_prompt": self.per_prompt(peak_rss(again.proc.pid)),
            }
            http.delete(f"/datasets/{self.name}")
        return step

    def finish(self, step: int) -> dict[str, Any]:
        out = self.out
        out["steps"] = step
        for key, xs in self.lat.items():
            out[f"{key}_p50_ms"] = _ms(median(xs))
            out[f"{key}_p90_ms"] = _ms(percentile(xs, 90))
            out[f"{key}_max_ms"] = _ms(max(xs) if xs else None)
        out["snapshot_log"] = [line.strip() for line in self.services[0].lines if "snapshot of" in line][:3]
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
