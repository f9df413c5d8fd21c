"""Plumbing shared by the benchmark scripts: paths, timing, percentiles, memory, options and output.

Every script under bench/ ends its stdout with one JSON line (its result) and writes the same object to
a file under bench/out/; ``emit`` does both, and ``last_json_line`` reads it back (bench/run_all.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "bench" / "out"


# ---- timing ------------------------------------------------------------------------------------------
def timed(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of ``repeats`` calls after one warm-up call, on ``clock`` (wall time by default;
    ``time.process_time`` gives CPU seconds, which a busy shared machine inflates far less)."""
    fn()
    samples = []
    for _ in range(repeats):
        started = clock()
        fn()
        samples.append(clock() - started)
    return statistics.median(samples)


def stream_bandwidth(
    nbytes: int = 1 << 29, repeats: int = 5, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Bytes read + written per second by ``np.copyto`` over a large array (one thread): the memory
    bandwidth floor a streaming pass cannot beat. Per CPU second with ``clock=time.process_time``."""
    import numpy as np

    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    return 2 * src.nbytes / timed(lambda: np.copyto(dst, src), repeats, clock)


def argpartition_seconds(n: int, batch: int, repeats: int = 30) -> float:
    """Median seconds of ``np.argpartition(x, n - batch)`` over ``n`` random float64: the floor of any
    whole-dataset top-k, the yardstick the service figures are divided by."""
    import numpy as np

    x = np.random.default_rng(0).random(n)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        np.argpartition(x, n - batch)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


# ---- statistics --------------------------------------------------------------------------------------
def median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The q-th percentile (numpy's linear interpolation); None for no samples."""
    import numpy as np

    return float(np.percentile(np.asarray(xs), q)) if len(xs) else None


# ---- memory ------------------------------------------------------------------------------------------
def proc_status_bytes(pid: int, field: str) -> int | None:
    """A memory field of /proc/<pid>/status (VmRSS, VmHWM = peak RSS) in bytes; None off Linux."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def peak_rss(pid: int | None = None) -> int | None:
    """Peak resident memory (VmHWM) of a process, bytes."""
    return proc_status_bytes(pid or os.getpid(), "VmHWM")


def reset_peak_rss(pid: int | None = None) -> bool:
    """Reset VmHWM of a process we own to its current RSS (Linux: write 5 to clear_refs)."""
    try:
        with open(f"/proc/{pid or os.getpid()}/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def rss(pid: int | None = None) -> int:
    """Resident memory of a process, bytes."""
    import psutil

    return psutil.Process(pid or os.getpid()).memory_info().rss


# ---- options -----------------------------------------------------------------------------------------
def parse_count(text: str) -> int:
    """'1e6' -> 1000000: a whole number >= 0 written as an int or in scientific notation."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"a whole number >= 0 is needed, got {text!r}")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """'1e5,1e6' -> [100000, 1000000], sorted and without duplicates; '' -> []."""
    sizes = [parse_count(part.strip()) for part in text.split(",") if part.strip()]
    if any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be >= 1, got {text!r}")
    return sorted(set(sizes))


def parser(doc: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """An argument parser described by the first paragraph of a script's docstring."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0], **kwargs)


def add_out(parser: argparse.ArgumentParser, default: Path, what: str = "result JSON") -> None:
    parser.add_argument("--out", type=Path, default=default, help=f"{what} (default {default})")


def fmt_n(n: int) -> str:
    """1e7 for powers of ten, else n with thousands separators."""
    exponent = math.log10(n) if n > 0 else 0.5
    return f"1e{int(exponent)}" if exponent == int(exponent) else f"{n:,}"


# ---- output ------------------------------------------------------------------------------------------
def emit(result: dict[str, Any], path: Path | None, indent: int = 2) -> None:
    """Write ``result`` to ``path`` (JSON) and print it as the last line of stdout."""
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=indent) + "\n", encoding="utf-8")
    print(json.dumps(result), flush=True)


def last_json_line(text: str) -> dict[str, Any] | None:
    """The result a benchmark printed: its last non-empty stdout line, when that is a JSON object."""
    for line in reversed(text.splitlines()):
        if line.strip():
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def redis_answers(url: str) -> bool:
    """Whether a Redis answers a ping at `url` (within about a second)."""
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError, ValueError):
        return False
