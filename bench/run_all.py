"""Run every benchmark, one after the other, and collect their results into one summary.

    python bench/run_all.py            # --quick: small sizes, a few minutes on 2 cores (`make bench`)
    python bench/run_all.py --full     # the documented configurations (about three hours on 2 cores)
    python bench/run_all.py --only toy_world,bench_service

Each script runs in a child process with the configuration below; its output goes to
``<out>/<name>.log`` and its result (the JSON object every script prints as its last stdout line) into
``bench/out/summary.json``, with the command, exit status and wall time. ``--quick`` writes the
scripts' own files under ``bench/out/quick/`` so that the documented figures in bench/out/ are not
replaced by small-size ones; ``--full`` writes them where the docs read them. The two model-based
benchmarks (mismatch, grpo_compare) need the trainer extras and vLLM, bench_service_redis a Redis at
``BENCH_REDIS_URL`` (default redis://127.0.0.1:6379/0), and rollout_trace the One-Shot-RLVR trace at
``BENCH_TRACE`` (default ../shared/data/one-shot-rlvr/acc_step_500.json); without them they are skipped.
Ends with a table (name, status, seconds, a few headline figures) and exits 1 when any run failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OUT_DIR, ROOT, last_json_line, redis_answers

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
#: The One-Shot-RLVR trace rollout_trace.py replays (not shipped; bench/rollout_trace.py says where it is from).
TRACE_PATH = os.environ.get(
    "BENCH_TRACE", str(ROOT.parent / "shared" / "data" / "one-shot-rlvr" / "acc_step_500.json")
)


@dataclass(frozen=True)
class Benchmark:
    name: str
    script: str
    quick: tuple[str, ...]  # arguments of the quick configuration; "{out}" is the output folder
    full: tuple[str, ...]  # arguments of the documented configuration
    headline: tuple[str, ...]  # dotted keys of the result shown in the table
    needs_vllm: bool = False
    needs_redis: bool = False  # a Redis at REDIS_URL (env BENCH_REDIS_URL)
    needs_file: str = ""  # a data file that must exist (its path is an argument too)


BENCHMARKS = (
    Benchmark(
        "bench_kernels",
        "bench_kernels.py",
        quick=("--n", "1000000", "--repeats", "2", "--n-cold", "100000", "--perm-sizes", "1e6", "--no-compile",
               "--out", "{out}/kernels.json"),
        full=("--out", "{out}/kernels.json"),
        headline=("dps_close_mprompts_per_s_allcores", "wmi_k8_mprompts_per_s_1thread"),
    ),
    Benchmark(
        "bench_scale",
        "bench_scale.py",
        quick=("--sizes", "1e5,1e6", "--reference-sizes", "1e4", "--service-n", "1e5", "--memory-n", "1e6",
               "--observed", "1e4", "--repeats", "2", "--replay-steps", "2", "--out", "{out}/scale.json"),
        full=("--out", "{out}/scale.json"),
        headline=("service.select_close_p50_ms", "service.restart.kill_to_first_select_s", "belief_bytes_per_prompt"),
    ),
    Benchmark(
        "bench_service",
        "bench_service.py",
        quick=("--n", "100000", "--steps", "6", "--create-n", "1000000", "--out", "{out}/service.json"),
        full=("--out", "{out}/service.json"),
        headline=("select_dps_close_ratio", "select_insight_ratio", "observe_ratio"),
    ),
    Benchmark(
        "bench_service_redis",
        "bench_service.py",
        quick=("--n", "100000", "--steps", "6", "--create-n", "0", "--redis-url", REDIS_URL,
               "--out", "{out}/service_redis.json"),
        full=("--redis-url", REDIS_URL, "--create-n", "0", "--out", "{out}/service_redis.json"),
        headline=("select_dps_close_ratio", "select_insight_ratio", "observe_ratio"),
        needs_redis=True,
    ),
    Benchmark(
        "bench_limits",
        "bench_limits.py",
        quick=("--observe-results", "30000,120000", "--magic-mib", "64", "--import-n", "1e5", "--create-n", "1e6",
               "--datasets", "200", "--out", "{out}/limits.json"),
        full=("--magic-mib", "128,512,1024", "--out", "{out}/limits.json"),
        headline=("worst_peak_over_body_observe", "worst_healthz_ms", "metrics.scrape_lines"),
    ),
    Benchmark(
        "bench_history",
        "bench_history.py",
        quick=("--n", "100000", "--steps", "10", "--request-steps", "12",
               "--out", "{out}/history.json"),
        full=("--out", "{out}/history.json"),
        headline=("max_request_ratio", "max_in_process_ratio"),
    ),
    Benchmark(
        "client_import",
        "client_import.py",
        quick=("--repeats", "5", "--out", "{out}/client_import.json"),
        full=("--out", "{out}/client_import.json"),
        headline=("client.median_s", "integrations.median_s", "meets_goal"),
    ),
    Benchmark(
        "load_test",
        "load_test.py",
        quick=("--duration", "15", "--warmup", "3", "--size", "5000", "--out", "{out}/load.json"),
        full=("--out", "{out}/load.json"),
        headline=("requests_per_s", "errors", "passed"),
    ),
    Benchmark(
        "toy_world",
        "toy_world.py",
        quick=("--quick", "--seeds", "2", "--no-progress", "--out", "{out}"),
        full=("--no-progress", "--out", "{out}"),
        headline=("seconds", "strategies.dps.final_accuracy", "strategies.uniform.final_accuracy"),
    ),
    Benchmark(
        "toy_world_large",
        "toy_world.py",
        quick=("--scenario", "large", "--quick", "--seeds", "1", "--no-progress", "--out", "{out}"),
        full=("--scenario", "large", "--no-progress", "--out", "{out}"),
        headline=("seconds", "strategies.dps.final_accuracy", "strategies.uniform.final_accuracy"),
    ),
    Benchmark(
        "toy_world_budget",
        "toy_world.py",
        quick=("--scenario", "budget", "--quick", "--seeds", "2", "--no-progress", "--out", "{out}"),
        full=("--scenario", "budget", "--no-progress", "--out", "{out}"),
        headline=("strategies.uniform@posterior.mixed_vs_fixed_k", "strategies.uniform@oracle.mixed_vs_fixed_k"),
    ),
    Benchmark(
        "toy_world_budget_large",
        "toy_world.py",
        quick=("--scenario", "budget-large", "--quick", "--seeds", "1", "--no-progress", "--out", "{out}"),
        full=("--scenario", "budget-large", "--no-progress", "--out", "{out}"),
        headline=("strategies.insight+groups@posterior.mixed_vs_fixed_k", "strategies.insight+groups.final_accuracy"),
    ),
    Benchmark(
        "learning",
        "learning.py",
        quick=("--regime", "smoke", "--strategies", "uniform,insight,oracle", "--seeds", "0,1", "--out", "{out}/learning"),
        full=("--regime", "best", "--strategies", "all", "--seeds", "0,1,2,3,4", "--out", "{out}/learning"),
        headline=("ratio_vs_uniform.insight", "ratio_vs_uniform.oracle", "results.uniform.final_heldout_sampled"),
    ),
    Benchmark(
        "learning_epochs",
        "learning.py",
        quick=("--regime", "epochs-smoke", "--strategies", "uniform,filter,filter_reprofile,recommended,oracle",
               "--seeds", "0", "--out", "{out}/learning"),
        full=("--regime", "epochs", "--strategies", "uniform,filter,filter_reprofile,recommended,oracle",
              "--seeds", "0,1,2,3,4", "--out", "{out}/learning"),
        headline=("ratio_vs_filter.recommended", "ratio_vs_filter.filter_reprofile", "dynamics.uniform_heldout_gain"),
    ),
    Benchmark(
        "rollout_trace",
        "rollout_trace.py",
        quick=(TRACE_PATH, "--k", "4", "--seeds", "2", "--out", "{out}"),
        full=(TRACE_PATH, "--k", "3,4,6", "--out", "{out}"),
        headline=("results.K=4.posterior.mixed_vs_fixed", "results.K=4.knapsack.mixed_vs_fixed"),
        needs_file=TRACE_PATH,
    ),
    Benchmark(
        "replay_scale",
        "replay_scale.py",
        quick=("--rows", "1e5", "--prompts", "5000", "--out", "{out}/replay_scale.json"),
        full=("--out", "{out}/replay_scale.json"),
        headline=("seconds", "seconds_over_target", "read_seconds"),
    ),
    Benchmark(
        "filter_trace",
        "filter_trace.py",
        quick=(TRACE_PATH, "--quick", "--seeds", "2", "--out", "{out}"),
        full=(TRACE_PATH, "--out", "{out}"),
        headline=("filter_esr", "static_filter_esr", "uniform_esr"),
        needs_file=TRACE_PATH,
    ),
    Benchmark(
        "bench_filter",
        "bench_filter.py",
        quick=("--sizes", "1e5", "--service-n", "1e5", "--upload-n", "1e6", "--repeats", "5", "--out", "{out}"),
        full=("--out", "{out}"),
        headline=("over_http.insight.ratio", "upload.seconds"),
    ),
    Benchmark(
        "mismatch",
        "mismatch.py",
        quick=("--prompts", "1", "--rollouts", "2", "--max-new-tokens", "8", "--out", "{out}/mismatch.json"),
        full=("--out", "{out}/mismatch.json"),
        headline=("trainer.fp32.mean_abs_per_token", "trainer.bf16.mean_abs_per_token"),
        needs_vllm=True,
    ),
    Benchmark(
        "grpo_compare",
        "grpo_compare.py",
        quick=("--quick", "--strategies", "insight", "--out", "{out}/grpo_compare"),
        full=("--out", "{out}/grpo_compare"),
        headline=("rollout_budget", "total_wall_s"),
        needs_vllm=True,
    ),
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sizes, a few minutes (the default)")
    mode.add_argument("--full", action="store_true", help="the documented configurations (about three hours)")
    names = ", ".join(b.name for b in BENCHMARKS)
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {names}")
    parser.add_argument("--timeout", type=float, help="seconds one benchmark may take (default 900 quick)")
    parser.add_argument("--summary", type=Path, default=OUT_DIR / "summary.json", help="summary JSON")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - {b.name for b in BENCHMARKS})
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; choose from {names}")
    args.benchmarks = [b for b in BENCHMARKS if not chosen or b.name in chosen]
    args.mode = "full" if args.full else "quick"
    args.out = OUT_DIR if args.full else OUT_DIR / "quick"
    return args


def run_one(bench: Benchmark, mode: str, out: Path, timeout: float | None) -> dict[str, Any]:
    """Run one benchmark in a child process, its output teed to <out>/<name>.log; its record."""
    arguments = [a.replace("{out}", str(out)) for a in (bench.full if mode == "full" else bench.quick)]
    command = [sys.executable, str(ROOT / "bench" / bench.script), *arguments]
    log_path = out / f"{bench.name}.log"
    record: dict[str, Any] = {"command": " ".join(command), "log": str(log_path)}
    if bench.needs_vllm and importlib.util.find_spec("vllm") is None:
        return {**record, "status": "skipped (vLLM is not installed)", "wall_s": 0.0, "result": None}
    if bench.needs_file and not Path(bench.needs_file).is_file():
        return {
            **record,
            "status": f"skipped (no {bench.needs_file}; BENCH_TRACE)",
            "wall_s": 0.0,
            "result": None,
        }
    if bench.needs_redis and not redis_answers(REDIS_URL):
        return {**record, "status": "skipped (no Redis at BENCH_REDIS_URL)", "wall_s": 0.0, "result": None}
    started = time.perf_counter()
    lines: list[str] = []
    with log_path.open("w", encoding="utf-8") as log:
        child = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert child.stdout is not None
        timer = threading.Timer(timeout, child.kill) if timeout is not None else None
        if timer is not None:
            timer.start()
        try:
            for line in child.stdout:
                log.write(line)
                lines.append(line)
                if not line.lstrip().startswith("{"):  # the result line is shown in the table instead
                    print(f"  | {line.rstrip()[:160]}", flush=True)
            returncode = child.wait()
        except KeyboardInterrupt:
            child.kill()
            child.wait()
            raise
        finally:
            if timer is not None:
                timer.cancel()
    wall_s = time.perf_counter() - started
    result = last_json_line("".join(lines))
    if timeout is not None and wall_s >= timeout and returncode != 0:
        status = f"failed (timed out after {timeout:.0f} s)"
    elif returncode != 0:
        status = f"failed (exit {returncode})"
    else:
        status = "ok" if result is not None else "failed (no JSON result line)"
    return {
        **record,
        "status": status,
        "returncode": returncode,
        "wall_s": round(wall_s, 1),
        "result": result,
    }


def lookup(result: dict[str, Any] | None, dotted: str) -> Any:
    value: Any = result
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def print_table(records: dict[str, dict[str, Any]]) -> None:
    def fmt(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "-" if value is None else str(value)

    print(f"\n{'benchmark':<20} {'status':<30} {'seconds':>8}  headline figures")
    for bench in BENCHMARKS:
        if bench.name not in records:
            continue
        record = records[bench.name]
        figures = ", ".join(f"{key}={fmt(lookup(record['result'], key))}" for key in bench.headline)
        print(f"{bench.name:<20} {record['status']:<30} {record['wall_s']:>8.1f}  {figures}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    timeout = args.timeout if args.timeout is not None else (900.0 if args.mode == "quick" else None)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    records: dict[str, dict[str, Any]] = {}
    for index, bench in enumerate(args.benchmarks, start=1):
        print(f"[{index}/{len(args.benchmarks)}] {bench.name} ({args.mode}) ...", flush=True)
        records[bench.name] = run_one(bench, args.mode, args.out, timeout)
        record = records[bench.name]
        print(
            f"[{index}/{len(args.benchmarks)}] {bench.name}: {record['status']} in {record['wall_s']:.0f} s"
        )
    summary = {
        "mode": args.mode,
        "out": str(args.out),
        "total_s": round(time.perf_counter() - started, 1),
        "benchmarks": records,
    }
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print_table(records)
    print(f"\n{len(records)} benchmarks in {summary['total_s']:.0f} s; summary: {args.summary}")
    failed = [
        name for name, r in records.items() if not (r["status"] == "ok" or r["status"].startswith("skipped"))
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
