"""How long `selector-service replay` takes on a large log: a synthetic run of 10^6 rows, replayed whole.

    python bench/replay_scale.py [--rows 1e6] [--prompts 20000] [--batch 250] [--format jsonl|parquet]

The log is a GRPO run over `--prompts` prompts, `--batch` per step, every prompt once per epoch in a new
order (drop_last), K = 8 rewards per group from a pass rate per prompt that drifts from epoch to epoch
(some prompts get learnt, a few forgotten); one row per group, `{"step", "prompt_id", "rewards": [...]}`,
as many epochs as fill `--rows` rows. The command runs as a user runs it (its own service on the embedded
store, every arm), in a child process; the seconds are its wall time, reading the log included. The
target is two minutes for 10^6 rows on this machine.

Ends stdout with one JSON line: rows, prompts, epochs, arms, seconds, seconds / 120 (the target), and the
seconds that reading and cutting the log into epochs take in-process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OUT_DIR, ROOT, emit, parse_count
from selector_service.replay.logs import read_log
from selector_service.replay.protocol import epochs_of

TARGET_S = 120.0


def write_log(path: Path, rows: int, prompts: int, batch: int, fmt: str, seed: int = 0) -> int:
    """The synthetic log (module docstring); returns its number of epochs."""
    rng = np.random.default_rng(seed)
    per_epoch = (prompts // batch) * batch
    epochs = max(2, rows // per_epoch)
    logit = rng.normal(-0.5, 2.0, size=prompts)
    drift = rng.normal(0.08, 0.1, size=prompts)
    steps, ids, rewards = [], [], []
    step = 0
    for _ in range(epochs):
        order = rng.permutation(prompts)[:per_epoch]
        p = 1.0 / (1.0 + np.exp(-logit[order]))
        succ = rng.random((per_epoch, 8)) < p[:, None]
        steps.append(np.repeat(np.arange(step, step + per_epoch // batch), batch))
        step += per_epoch // batch
        ids.append(order)
        rewards.append(succ.astype(np.int8))
        logit += drift
    all_steps = np.concatenate(steps)
    all_ids = np.concatenate(ids)
    all_rewards = np.concatenate(rewards)
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table(
            {
                "step": all_steps,
                "prompt_id": all_ids,
                "rewards": pa.FixedSizeListArray.from_arrays(all_rewards.reshape(-1).astype(np.float64), 8),
            }
        )
        pq.write_table(table, path)
    else:
        with path.open("w", encoding="utf-8") as out:
            for s, i, r in zip(all_steps.tolist(), all_ids.tolist(), all_rewards.tolist(), strict=True):
                out.write(f'{{"step": {s}, "prompt_id": {i}, "rewards": {json.dumps(r)}}}\n')
    return epochs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--rows", type=parse_count, default=1_000_000, help="rows of the log (about)")
    parser.add_argument("--prompts", type=parse_count, default=20_000, help="prompts in the run's pool")
    parser.add_argument("--batch", type=int, default=250, help="prompts per step")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl", help="the log's format")
    parser.add_argument("--arms", help="only these arms (default: every arm)")
    parser.add_argument("--out", type=Path, default=OUT_DIR / "replay_scale.json", help="result JSON")
    args = parser.parse_args()
    if not 1 <= args.batch <= args.prompts:
        parser.error("--batch must lie in 1..--prompts")
    with tempfile.TemporaryDirectory(prefix="replay-scale-") as tmp:
        log = Path(tmp) / f"run.{args.format}"
        started = time.perf_counter()
        epochs = write_log(log, args.rows, args.prompts, args.batch, args.format)
        written = time.perf_counter() - started
        started = time.perf_counter()
        table = epochs_of(read_log(log))
        read_s = time.perf_counter() - started
        command = [sys.executable, "-m", "selector_service", "replay", str(log), "--no-progress"]
        command += ["--out", str(Path(tmp) / "replay")]
        if args.arms:
            command += ["--arms", args.arms]
        started = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(
                f"replay_scale: the command failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        rows = sum(1 for _ in log.open("rb")) if args.format == "jsonl" else table.epochs[0].size * epochs
    print(proc.stdout.rstrip())
    emit(
        {
            "benchmark": "replay_scale",
            "format": args.format,
            "rows": rows,
            "prompts": result["prompts"],
            "epochs": result["epochs"],
            "batch_size": result["batch_size"],
            "arms": len(result["arms"]),
            "seconds": round(seconds, 2),
            "seconds_over_target": round(seconds / TARGET_S, 3),
            "read_seconds": round(read_s, 2),
            "write_seconds": round(written, 2),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
