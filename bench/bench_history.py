"""What the step history costs at select and observe, as ratios to the same work without it, one run.

    python bench/bench_history.py [--n 1000000] [--batch 256] [--steps 60] [--request-steps 60]
                                  [--redis-url URL | --embedded]

Two DatasetStates of N prompts apply the same log, step after step: a select record (an advance that
carries a select's note), then an observe record of B results (K = 8), then the next step's select
closes the step. One state keeps its history (history.py), the other has it replaced by a no-op, and
the two alternate within every step so that both see the same load on a shared machine. Reported: the
median time of applying each kind of record with the history over the time without it (observe, and
select with its step close).

Then the requests themselves, the cost a trainer sees: two real services on the same store (separate
key prefixes), one as shipped and one whose history methods are replaced by no-ops in its own process,
take the same workload (observe B results, INSIGHT select at the open step, DPS select that closes
it), request by request, each service first in turn. Without a history a select at the open step
would write nothing, so the no-op service skips that write too (its history says every request was
already counted); with one, that select commits its note (a closing reservation and a conditional
append, two round trips); the ratio is the median latency of each request
with history over without. Target: every request ratio <= 1.05 (no measurable cost); the in-process
ratios above say where the few microseconds go (an apply is a small part of a request) and are
reported, not targeted. Prints a table and one JSON line last.
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import OUT_DIR, ROOT, add_out, emit, redis_answers
from selector_service.dataset.history import select_note
from selector_service.dataset.state import DatasetSpec, DatasetState, pack_results
from selector_service.launcher import ServiceProcess

TARGET = 1.05


class _NoHistory:
    """The history's interface, doing nothing."""

    def select(self, *args: Any) -> None:
        pass

    def observe(self, *args: Any) -> None:
        pass

    def close(self, *args: Any) -> None:
        pass


def _record(n: int, kind: str, step: int, **fields: bytes) -> tuple[str, dict[str, bytes]]:
    return f"1-{n}", {"n": str(n).encode(), "k": kind.encode(), "s": str(step).encode(), **fields}


def in_process(n: int, batch: int, steps: int) -> dict[str, Any]:
    spec = DatasetSpec(name="bench-history", size=n)
    with_h, without = DatasetState(spec), DatasetState(spec)
    without.history = _NoHistory()  # type: ignore[assignment]
    rng = np.random.default_rng(0)
    times: dict[str, dict[str, list[float]]] = {k: {"on": [], "off": []} for k in ("select", "observe")}
    seq = 0
    for step in range(steps):
        ids = rng.choice(n, batch, replace=False)
        succ = rng.integers(0, 9, batch).astype(np.float64)
        trials = np.full(batch, 8.0)
        states = np.where(succ == 0, 1, np.where(succ == 8, 3, 2)).astype(np.int8)
        note = select_note("insight", batch, f"{step:024x}").encode()
        records = {
            "select": _record(seq + 1, "a", step, q=note),
            "observe": _record(seq + 2, "o", step, p=pack_results(ids, succ, trials, states)),
        }
        seq += 2
        for kind in ("select", "observe"):
            order = [("on", with_h), ("off", without)] if step % 2 else [("off", without), ("on", with_h)]
            for label, state in order:
                t0 = time.perf_counter()
                state.apply_record(*records[kind])
                times[kind][label].append(time.perf_counter() - t0)
    warm = 3
    out: dict[str, Any] = {}
    for kind, pair in times.items():
        on, off = statistics.median(pair["on"][warm:]), statistics.median(pair["off"][warm:])
        out[kind] = {"with_history_ms": 1e3 * on, "without_ms": 1e3 * off, "ratio": on / off}
    assert with_h.history.n == steps - 1
    return out


class _ServiceWithoutHistory(ServiceProcess):
    """The service, with StepHistory's select / observe / close made no-ops in the child process, and
    every select at the open step taken as already counted (so it writes no note)."""

    def command(self) -> list[str]:
        cmd = super().command()
        patch = (
            "import sys; from selector_service.dataset.history import StepHistory as H; "
            "H.select = H.observe = H.close = lambda *a, **k: None; H.counted = lambda *a: True; "
            "from selector_service.server.cli import main; sys.argv[0] = 'selector-service'; sys.exit(main())"
        )
        return [cmd[0], "-c", patch, *cmd[3:]]  # cmd: python -m selector_service serve ...


def requests_side(redis_url: str | None, n: int, batch: int, steps: int) -> dict[str, Any]:
    import httpx

    prefix = f"bench-history-{os.getpid()}"
    services = {}
    for label, cls in (("on", ServiceProcess), ("off", _ServiceWithoutHistory)):
        data_dir = None if redis_url else tempfile.mkdtemp()
        env = {"SELECTOR_KEY_PREFIX": f"{prefix}-{label}"}
        services[label] = cls(redis_url=redis_url, data_dir=data_dir, env=env, cwd=ROOT).start()
    times: dict[str, dict[str, list[float]]] = {
        k: {"on": [], "off": []} for k in ("observe", "select_open_step", "select_close")
    }
    try:
        clients = {label: httpx.Client(base_url=svc.url, timeout=300) for label, svc in services.items()}
        name = "bench-history"
        for client in clients.values():
            client.post("/datasets", json={"name": name, "size": n, "hmm_decay": 0.7}).raise_for_status()
            client.post("/select", json={"dataset": name, "step": 0, "batch_size": batch}).raise_for_status()
        rng = np.random.default_rng(1)
        for step in range(steps):
            ids = rng.choice(n, batch, replace=False)
            results = [{"prompt_id": int(i), "rewards": rng.integers(0, 2, 8).tolist()} for i in ids]
            sel = {"dataset": name, "batch_size": batch}
            work = {
                "observe": (
                    "/observe",
                    {"dataset": name, "step": step, "request_id": f"b{step}", "results": results},
                ),
                "select_open_step": ("/select", {**sel, "step": step, "strategy": "insight", "seed": step}),
                "select_close": ("/select", {**sel, "step": step + 1, "strategy": "dps"}),
            }
            for kind, (path, body) in work.items():
                order = ("on", "off") if step % 2 else ("off", "on")
                for label in order:
                    t0 = time.perf_counter()
                    clients[label].post(path, json=body).raise_for_status()
                    if step >= 3:  # the first steps compile kernels
                        times[kind][label].append(time.perf_counter() - t0)
        rows = clients["on"].get(f"/datasets/{name}/history").json()["rows"]
        assert len(rows) == steps, len(rows)
        for client in clients.values():
            client.close()
    finally:
        for svc in services.values():
            svc.stop()
    out: dict[str, Any] = {}
    for kind, pair in times.items():
        on, off = statistics.median(pair["on"]), statistics.median(pair["off"])
        out[f"request_{kind}"] = {"with_history_ms": 1e3 * on, "without_ms": 1e3 * off, "ratio": on / off}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=float, default=1e6)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--request-steps", type=int, default=60, help="steps of the request comparison (0: skip)")
    p.add_argument("--embedded", action="store_true", help="run the request comparison on the embedded store")
    add_out(p, OUT_DIR / "bench_history.json")
    args = p.parse_args()
    n = int(args.n)
    result: dict[str, Any] = {"n": n, "batch": args.batch, "steps": args.steps, "target": TARGET}
    result.update(in_process(n, args.batch, args.steps))
    in_proc = [v["ratio"] for v in result.values() if isinstance(v, dict)]
    result["max_in_process_ratio"] = max(in_proc)
    result["ok"] = None  # the target is on the requests
    if args.request_steps:
        url = None if args.embedded or not redis_answers(args.redis_url) else args.redis_url
        result.update(requests_side(url, n, args.batch, args.request_steps))
        result["store"] = "redis" if url else "embedded-valkey"
        requests = [v["ratio"] for k, v in result.items() if k.startswith("request_")]
        result["max_request_ratio"] = max(requests)
        result["ok"] = result["max_request_ratio"] <= TARGET
    print(f"{'record':<28}{'with history':>14}{'without':>12}{'ratio':>8}")
    for key, v in result.items():
        if isinstance(v, dict):
            a, b = (x for k, x in v.items() if k.endswith("_ms"))
            print(f"{key:<28}{a:>12.3f}ms{b:>10.3f}ms{v['ratio']:>8.3f}")
    emit(result, args.out)


if __name__ == "__main__":
    main()
