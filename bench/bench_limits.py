"""What one request can cost the service: peak memory per request kind and size, and how long /healthz
waits meanwhile.

    python bench/bench_limits.py [--observe-results 30000,120000,480000] [--magic-mib 128,512]
                                 [--import-n 1e6] [--create-n 1e7] [--datasets 4000] [--repo DIR]

Each case runs against a fresh service on a private Redis (the real `serve` in a child process): its
peak resident memory (VmHWM, reset before the case through /proc/PID/clear_refs) above what it held
before, the seconds the request took, what it answered, and the slowest of the /healthz calls another
client made every 20 ms meanwhile. The cases:

- **observe**: one /observe of N results with one reward each (480k results is a 15.9 MiB body, just
  under SELECTOR_MAX_BODY_BYTES);
- **import_bad_magic**: an import body of M MiB whose first bytes are not an export, streamed;
- **import**: the export of a dataset of N prompts (a tenth observed) imported again; its peak is
  compared with the dataset's own arrays;
- **create**: one create of N prompts, and the same create under a memory budget too small for it;
- **headers**: one request with an 8 MiB header line; 40 connections each sending an unfinished 8 MiB
  header, and 300 trickling theirs: memory, and how many are still open after the head timeout;
- **metrics**: D datasets, then a scrape (lines, bytes, seconds), then a restart and how long until a
  scrape shows any dataset's series.

`--repo DIR` runs the service from another checkout (the branch's base, say) with this interpreter, so
that both are measured on one machine in one run; cases that setting only this version knows are
reported as the base answers them. Prints a table, then one JSON line last (also written to --out).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import (
    OUT_DIR,
    add_out,
    emit,
    parse_count,
    parse_sizes,
    parser,
    peak_rss,
    reset_peak_rss,
    rss,
)
from tests.utils import RedisServer, ServiceProcess

MIB = 2**20
HEALTH_EVERY_S = 0.02


class Service(ServiceProcess):
    """The service run from `repo` (its own source first on the path)."""

    def __init__(self, repo: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.repo = repo
        self.cwd = repo

    def child_env(self) -> dict[str, str]:
        env = super().child_env()
        env["PYTHONPATH"] = str(self.repo)
        return env


_PROBE = """
import sys, threading, time, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
samples, failures = [], 0
with httpx.Client(base_url=sys.argv[1], timeout=60) as http:
    print("ready", flush=True)
    while not stop.is_set():
        started = time.perf_counter()
        try:
            http.get("/healthz")
            samples.append(time.perf_counter() - started)
        except httpx.HTTPError:
            failures += 1
        stop.wait(float(sys.argv[2]))
print(repr((samples, failures)), flush=True)
"""


class HealthProbe:
    """Calls /healthz every HEALTH_EVERY_S on its own connection, from a process of its own (a thread of
    this one would wait for this process's own GIL), while a case runs; `worst` is the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[float] = []
        self.failures = 0
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> HealthProbe:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE, self.url, str(HEALTH_EVERY_S)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        self._proc.stdout.readline()  # "ready"
        time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        out, _ = self._proc.communicate("", timeout=120)
        self.samples, self.failures = ast.literal_eval(out.strip().splitlines()[-1])

    @property
    def worst(self) -> float | None:
        return max(self.samples) if self.samples else None


def measure(svc: ServiceProcess, action: Callable[[], Any]) -> dict[str, Any]:
    """Runs `action` with the health probe on; the service's peak memory above its memory before."""
    pid = svc.proc.pid
    before = rss(pid)
    reset_peak_rss(pid)
    with HealthProbe(svc.url) as probe:
        started = time.perf_counter()
        answer = action()
        seconds = time.perf_counter() - started
        time.sleep(0.05)
    peak = peak_rss(pid) or 0
    return {
        "answer": answer,
        "seconds": round(seconds, 3),
        "peak_mb": round((peak - before) / 1e6, 1),
        "healthz_worst_ms": round(probe.worst * 1e3, 1) if probe.worst is not None else None,
        "healthz_median_ms": round(statistics.median(probe.samples) * 1e3, 2) if probe.samples else None,
    }


def observe_body(name: str, n: int) -> bytes:
    results = [{"prompt_id": i % 1000, "rewards": [i % 2]} for i in range(n)]
    body = {"dataset": name, "step": 0, "request_id": f"{name}-{n}", "results": results}
    return json.dumps(body, separators=(",", ":")).encode()  # 480k results: 15.9 MiB


def stream(head: bytes, total: int, piece: int = MIB) -> Iterator[bytes]:
    yield head
    sent = len(head)
    filler = b"\0" * piece
    while sent < total:
        take = min(piece, total - sent)
        yield filler[:take]
        sent += take


def case_observe(svc: ServiceProcess, sizes: list[int]) -> list[dict]:
    out = []
    with httpx.Client(base_url=svc.url, timeout=600) as http:
        http.post("/datasets", json={"name": "obs", "size": 1000}).raise_for_status()
        warm = observe_body("obs", 5000)  # the first observe compiles kernels and starts threads
        http.post("/observe", content=warm, headers={"content-type": "application/json"}).raise_for_status()
        for n in sizes:
            body = observe_body("obs", n)

            def send(body: bytes = body) -> Any:
                r = http.post("/observe", content=body, headers={"content-type": "application/json"})
                return r.status_code

            row = measure(svc, send)
            row.update(results=n, body_mib=round(len(body) / MIB, 2))
            row["peak_over_body"] = round(row["peak_mb"] * 1e6 / len(body), 1)
            out.append(row)
    return out


def case_import_bad_magic(svc: ServiceProcess, sizes_mib: list[int]) -> list[dict]:
    out = []
    with httpx.Client(base_url=svc.url, timeout=600) as http:
        for mib in sizes_mib:

            def send(mib: int = mib) -> Any:
                total = mib * MIB
                r = http.post(
                    "/datasets/bad/import",
                    content=stream(b"NOTANEXPORT", total),
                    headers={"content-type": "application/octet-stream", "content-length": str(total)},
                )
                return r.status_code

            row = measure(svc, send)
            row["body_mib"] = mib
            out.append(row)
    return out


def case_import(svc: ServiceProcess, n: int) -> dict:
    with httpx.Client(base_url=svc.url, timeout=600) as http:
        http.post("/datasets", json={"name": "src", "size": n}).raise_for_status()
        observed = max(1, n // 10)
        for lo in range(0, observed, 50_000):
            results = [
                {"prompt_id": i, "successes": i % 3, "trials": 4}
                for i in range(lo, min(observed, lo + 50_000))
            ]
            body = {"dataset": "src", "step": 0, "request_id": f"src-{lo}", "results": results}
            http.post("/observe", json=body).raise_for_status()
        blob = http.get("/datasets/src/export").content
        http.delete("/datasets/src").raise_for_status()
        http.post("/datasets", json={"name": "warm", "size": 100}).raise_for_status()  # the first import
        warm = http.get("/datasets/warm/export").content  # compiles the domain checks: not measured
        http.post("/datasets/warm2/import", content=warm).raise_for_status()

        def send() -> Any:
            return http.post("/datasets/copy/import", content=blob).status_code

        row = measure(svc, send)
    row.update(
        prompts=n, export_mib=round(len(blob) / MIB, 2), arrays_mb=round((43 * n + 65 * observed) / 1e6, 1)
    )
    row["peak_over_arrays"] = round(row["peak_mb"] / row["arrays_mb"], 2)
    return row


def case_create(svc: ServiceProcess, n: int) -> dict:
    with httpx.Client(base_url=svc.url, timeout=600) as http:
        row = measure(svc, lambda: http.post("/datasets", json={"name": "big", "size": n}).status_code)
    row["prompts"] = n
    return row


def case_create_over_budget(redis_url: str, repo: Path, n: int) -> dict:
    """A create over SELECTOR_MEMORY_BUDGET_BYTES: its answer, and whether the dataset exists after."""
    budget = 43 * n // 2  # half of what the arrays alone take
    env = {"SELECTOR_MEMORY_BUDGET_BYTES": str(budget)}
    with (
        Service(repo, redis_url=redis_url, env=env) as svc,
        httpx.Client(base_url=svc.url, timeout=600) as http,
    ):
        r = http.post("/datasets", json={"name": "over", "size": n})
        listed = "over" in http.get("/datasets").json()["datasets"]
        http.delete("/datasets/over")
    return {"prompts": n, "budget_mb": round(budget / 1e6, 1), "answer": r.status_code, "created": listed}


def _address(svc: ServiceProcess) -> tuple[str, int]:
    url = urllib.parse.urlparse(svc.url)
    return url.hostname, url.port


def case_headers(svc: ServiceProcess, head_timeout_s: float) -> dict:
    big = b"a" * (8 * MIB)

    def one() -> Any:
        with socket.create_connection(_address(svc), timeout=60) as sock:
            try:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + big + b"\r\n\r\n")
                answer = sock.recv(64)
            except OSError:
                return "closed"
            return answer.split(b"\r\n")[0].decode(errors="replace") or "closed"

    row = {"one_8mib_line": measure(svc, one)}

    socks: list[socket.socket] = []

    def unfinished() -> Any:
        for _ in range(40):
            sock = socket.create_connection(_address(svc), timeout=60)
            with contextlib.suppress(OSError):  # refused: what the bound is for
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + big)
            socks.append(sock)
        return len(socks)

    row["forty_unfinished_8mib"] = measure(svc, unfinished)
    time.sleep(head_timeout_s + 2)
    row["forty_unfinished_8mib"]["open_after_timeout"] = sum(_still_open(s) for s in socks)
    for s in socks:
        s.close()

    trickling: list[socket.socket] = []
    for _ in range(300):
        sock = socket.create_connection(_address(svc), timeout=60)
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        trickling.append(sock)
    deadline = time.monotonic() + head_timeout_s + 2
    while time.monotonic() < deadline:
        for sock in trickling:
            with contextlib.suppress(OSError):
                sock.send(b"X")
        time.sleep(0.5)
    row["trickling_300"] = {"open_after_timeout": sum(_still_open(s) for s in trickling)}
    for s in trickling:
        s.close()
    return row


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        data = sock.recv(65536)
        return data != b"" and not data.startswith(b"HTTP/1.1 4")
    except BlockingIOError:
        return True
    except OSError:
        return False


def case_metrics(redis_url: str, repo: Path, datasets: int) -> dict:
    prefix = f"benchlim{os.getpid()}"
    env = {"SELECTOR_METRICS_WAIT_S": "1"}
    with (
        Service(repo, redis_url=redis_url, prefix=prefix, env=env) as svc,
        httpx.Client(base_url=svc.url, timeout=600) as http,
    ):
        for i in range(datasets):
            http.post("/datasets", json={"name": f"m{i:05d}", "size": 1000}).raise_for_status()
            body = {"dataset": f"m{i:05d}", "step": 0, "request_id": f"m{i}",
                    "results": [{"prompt_id": 1, "successes": 1, "trials": 2}]}  # fmt: skip
            http.post("/observe", json=body).raise_for_status()
        for _ in range(120):  # until a refresh has read every dataset
            text = http.get("/metrics").text
            if f'dataset="m{datasets - 1:05d}"' in text or "_other" in text:
                break
            time.sleep(1)
        started = time.perf_counter()
        text = http.get("/metrics").text
        seconds = time.perf_counter() - started
    row = {
        "datasets": datasets,
        "scrape_lines": len(text.splitlines()),
        "scrape_mb": round(len(text.encode()) / 1e6, 2),
        "scrape_s": round(seconds, 3),
        "dataset_labels": len(
            {line.split('dataset="')[1].split('"')[0] for line in text.splitlines() if 'dataset="' in line}
        ),
    }
    with Service(repo, redis_url=redis_url, prefix=prefix, env=env) as again:
        started = time.perf_counter()
        with httpx.Client(base_url=again.url, timeout=600) as http:
            while time.perf_counter() - started < 120:
                if "selector_dataset_prompts{" in http.get("/metrics").text:
                    break
                time.sleep(0.2)
        row["first_dataset_series_after_restart_s"] = round(time.perf_counter() - started, 2)
    return row


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The worst figures of the run, flat: peak memory over the body for observes, over the arrays for
    an import, and the slowest /healthz under any single request."""
    cases = [*result.get("observe", []), *result.get("import_bad_magic", [])]
    cases += [result[k] for k in ("import", "create") if k in result]
    cases += list(result.get("headers", {}).values())
    probes = [c["healthz_worst_ms"] for c in cases if c.get("healthz_worst_ms") is not None]
    out: dict[str, Any] = {"worst_healthz_ms": max(probes) if probes else None}
    if result.get("observe"):
        out["worst_peak_over_body_observe"] = max(c["peak_over_body"] for c in result["observe"])
    if result.get("import_bad_magic"):
        out["worst_peak_mb_import_bad_magic"] = max(c["peak_mb"] for c in result["import_bad_magic"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--observe-results", type=parse_sizes, default=parse_sizes("30000,120000,480000"))
    p.add_argument("--magic-mib", type=parse_sizes, default=parse_sizes("128,512"))
    p.add_argument("--import-n", type=parse_count, default=10**6)
    p.add_argument("--create-n", type=parse_count, default=10**7)
    p.add_argument(
        "--datasets", type=parse_count, default=4000, help="datasets of the metrics case (0: skip)"
    )
    p.add_argument(
        "--head-timeout-s", type=float, default=10.0, help="the service's head timeout (default's)"
    )
    p.add_argument("--skip", default="", help="comma-separated cases to skip")
    p.add_argument(
        "--repo", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to serve from"
    )
    add_out(p, OUT_DIR / "limits.json")
    args = p.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    redis = RedisServer().start()
    result: dict[str, Any] = {"repo": str(args.repo)}
    try:
        env = {"SELECTOR_HEADER_TIMEOUT_S": str(args.head_timeout_s)}
        with Service(args.repo, redis_url=redis.url, env=env) as svc:
            if "observe" not in skip:
                result["observe"] = case_observe(svc, args.observe_results)
            if "import_bad_magic" not in skip:
                result["import_bad_magic"] = case_import_bad_magic(svc, args.magic_mib)
            if "import" not in skip:
                result["import"] = case_import(svc, args.import_n)
            if "headers" not in skip:
                result["headers"] = case_headers(svc, args.head_timeout_s)
        if "create" not in skip:
            with Service(args.repo, redis_url=redis.url) as svc:
                result["create"] = case_create(svc, args.create_n)
            result["create_over_budget"] = case_create_over_budget(redis.url, args.repo, args.create_n)
        if "metrics" not in skip and args.datasets:
            result["metrics"] = case_metrics(redis.url, args.repo, args.datasets)
    finally:
        redis.stop()
        shutil.rmtree(redis.dir, ignore_errors=True)
    result.update(headline(result))
    for key, value in result.items():
        print(f"{key:28s} {json.dumps(value)[:400]}")
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
