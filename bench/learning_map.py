"""Where can selection buy accuracy at all? The oracle's gain over uniform, knob by knob, on the real learner.

    python bench/learning_map.py --seeds 0,1,2              # every cell below (a few hours on 2 cores)
    python bench/learning_map.py --cells pool20k,pool20k-lr3e-4 --seeds 0,1,2

Each cell is the ``base`` regime of bench/learning.py with a few settings changed (`CELLS`), run with
``uniform`` and ``oracle`` (the ceiling of selection by pass rate) over the seeds, paired by seed. Where
even the oracle gains nothing, no strategy can. Per cell: the final held-out accuracy (sampled, exact)
of both and their paired difference, the pool's accuracy (what the run trained on) likewise, the mixed
groups, and the oracle's ``ratio_vs_uniform`` (uniform's rollouts to its own final held-out accuracy over
the oracle's; 1 when uniform's held-out accuracy does not rise at all, since both then "reach" it at 0).
Runs are stored per cell under --out and reused with --reuse; prints a table and a JSON last line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OUT_DIR, emit
from bench.learner import report
from bench.learner.regimes import REGIMES

DEFAULT_OUT = OUT_DIR / "learning" / "map"
HARD_EASY = {"hopeless": 0.35, "solved": 0.35}

#: name -> (what it changes, the base regime's fields it sets)
CELLS: dict[str, tuple[str, dict[str, Any]]] = {
    "pool2k": ("2,000 prompts (each seen ~5 times), lr 1e-4", {}),
    "pool2k-lr3e-4": ("2,000 prompts, lr 3e-4", {"lr": 3e-4}),
    "pool5k": ("5,000 prompts (each seen ~2 times), lr 1e-4", {"pool_size": 5000}),
    "pool20k-lr3e-5": ("20,000 prompts (each seen ~0.5 times), lr 3e-5", {"pool_size": 20000, "lr": 3e-5}),
    "pool20k": ("20,000 prompts, lr 1e-4", {"pool_size": 20000}),
    "pool20k-lr3e-4": ("20,000 prompts, lr 3e-4", {"pool_size": 20000, "lr": 3e-4}),
    "pool20k-active": ("20,000 prompts, lr 1e-4, loss over the tokens of mixed groups only",
                       {"pool_size": 20000, "loss_norm": "active_token"}),
    "pool20k-nostd": ("20,000 prompts, lr 1e-4, advantages not divided by the group's std",
                      {"pool_size": 20000, "scale_by_std": False}),
    "pool20k-hard-easy": ("20,000 prompts, 70% hopeless or solved at the start, lr 1e-4",
                          {"pool_size": 20000, "composition": HARD_EASY}),
    "pool20k-b128": ("20,000 prompts, lr 1e-4, B = 128 (75 steps: the same rollouts)",
                     {"pool_size": 20000, "batch_size": 128, "steps": 75}),
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default="all", help=f"comma-separated, or 'all': {', '.join(CELLS)}")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (default 2)")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})"
    )
    parser.add_argument("--reuse", action="store_true", help="reuse runs already stored under --out")
    args = parser.parse_args(argv)
    names = list(CELLS) if args.cells == "all" else [c.strip() for c in args.cells.split(",") if c.strip()]
    unknown = [c for c in names if c not in CELLS]
    if unknown or not names:
        parser.error(f"--cells: unknown {', '.join(unknown) or '(none)'}; choose from {', '.join(CELLS)}")
    args.cell_list = names
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    return args


def cell_row(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary = report.summarize(runs, ["uniform", "oracle"])["strategies"]
    uniform, oracle = summary["uniform"], summary["oracle"]
    return {
        "cell": name,
        "about": CELLS[name][0],
        "uniform_initial": uniform["initial_heldout_sampled"],
        "uniform_final": uniform["final_heldout_sampled"],
        "uniform_final_se": uniform["final_heldout_sampled_se"],
        "oracle_final": oracle["final_heldout_sampled"],
        "oracle_final_se": oracle["final_heldout_sampled_se"],
        "oracle_gain": oracle["vs_uniform_heldout_sampled"],
        "oracle_gain_se": oracle["vs_uniform_heldout_sampled_se"],
        "oracle_wins": oracle["wins"],
        "pool_uniform_final": uniform["final_pool_sampled"],
        "pool_oracle_gain": oracle["vs_uniform_pool_sampled"],
        "pool_oracle_gain_se": oracle["vs_uniform_pool_sampled_se"],
        "mixed_uniform": uniform["mixed_share"],
        "mixed_oracle": oracle["mixed_share"],
        "oracle_ratio_vs_uniform": oracle["ratio_vs_uniform"],
        "oracle_ratio_vs_uniform_se": oracle["ratio_vs_uniform_se"],
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    f = report._f
    lines = [
        "| cell | held-out: start | uniform, final | oracle, final | oracle - uniform (paired) | pool: uniform "
        "final | pool: oracle - uniform | mixed groups, uniform / oracle | oracle's ratio vs uniform |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['about']} | {f(r['uniform_initial'])} | {f(r['uniform_final'], r['uniform_final_se'])} "
            f"| {f(r['oracle_final'], r['oracle_final_se'])} | {f(r['oracle_gain'], r['oracle_gain_se'])} "
            f"({r['oracle_wins']}) | {f(r['pool_uniform_final'])} | "
            f"{f(r['pool_oracle_gain'], r['pool_oracle_gain_se'])} | {f(r['mixed_uniform'], None, 2)} / "
            f"{f(r['mixed_oracle'], None, 2)} | {f(r['oracle_ratio_vs_uniform'], r['oracle_ratio_vs_uniform_se'], 2)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from bench.learning import run_comparison

    args = parse_args(argv)
    started = time.perf_counter()
    rows = []
    for name in args.cell_list:
        regime = REGIMES["base"].with_(name=f"map-{name}", about=CELLS[name][0], **CELLS[name][1])
        runs = run_comparison(
            regime, ["uniform", "oracle"], args.seed_list, args.out, parallel=args.parallel, reuse=args.reuse
        )
        rows.append(cell_row(name, runs))
        print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    table = markdown(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "learning_map.md").write_text(table)
    print(table)
    emit({"benchmark": "learning_map", "seeds": args.seed_list, "cells": rows,
          "seconds": time.perf_counter() - started}, args.out / "learning_map.json")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
