"""The filter's defaults, measured on a real run's outcomes: which bounds, re-check share and forgetting keep
the most learning signal per rollout, profiling counted?

    python bench/filter_trace.py PATH [--seeds 5] [--batch-size 128] [--quick]

PATH is the One-Shot-RLVR trace (`data/acc_step_500.json` of github.com/ypwang61/One-Shot-RLVR, Apache-2.0;
bench/rollout_trace.py describes it): the training accuracy of each of 1,209 DeepScaleR prompts at every
epoch of a 500-step GRPO run, 8 rollouts per prompt per epoch.

The replay uses the core directly (selector_service.core, as DatasetState does), per arm and seed:

1. Profile: epoch 0's outcomes are uploaded as every prompt's pass rate with its sample count, 8
   (`apply_metadata(..., pass_samples=8, profile=True)`): 1,209 x 8 = 9,672 profiling rollouts, counted.
   Arms marked `cold` upload nothing (and spend nothing).
2. Epochs 1..E-1: the arm's select picks B prompts (`strategies.select`, the filter as a select's
   `filter` or strategy `filter`'s params), each picked prompt's group is that epoch's 8 real outcomes,
   and the group is reported to the beliefs like /observe does (`apply_results`, then the step's close).

Reported per arm, mean ± standard error over seeds: the effective-sample ratio (ESR: share of picked
groups with a success and a failure, GRPO's learning signal) over all epochs and the last 10, mixed
groups per rollout with the profile counted, and how many prompts the filter keeps at the last epoch.
A group here is the whole epoch's outcome of the prompt, so the only randomness is in the picks (the
walks, pools, re-checks and ties): the seeds say how much the choices of one arm vary.

Writes bench/out/filter_trace.json; ends stdout with one JSON line (docs/methods.md §9 cites it).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OUT_DIR, emit
from bench.rollout_trace import SOURCE, Trace, load_trace
from selector_service.core import BeliefArrays, apply_results, close_open_step, outcomes_from_counts
from selector_service.core.coldstart import apply_metadata
from selector_service.core.filter import KEEP, Filter, judge
from selector_service.core.strategies import select, validate_filter

#: Where a checkout finds the trace by default: ../shared beside it (or beside its worktrees' folder).
_TRACE = Path("shared", "data", "one-shot-rlvr", "acc_step_500.json")
DEFAULT_TRACE = next(
    (p / _TRACE for p in Path(__file__).resolve().parents[2:4] if (p / _TRACE).is_file()),
    Path(__file__).resolve().parents[2] / _TRACE,
)


@dataclass(frozen=True)
class Arm:
    name: str
    strategy: str
    params: dict[str, Any] = field(default_factory=dict)
    filter: dict[str, Any] | None = None
    beta_decay: float = 1.0
    profile: bool = True  # epoch 0's rates uploaded (and their rollouts counted)

    def settings(self) -> dict[str, Any] | None:
        """The filter this arm judges by (for the kept count), if any."""
        if self.strategy == "filter":
            return validate_filter(self.params)
        return None if self.filter is None else validate_filter(self.filter)


def arms(quick: bool) -> list[Arm]:
    out = [
        Arm("uniform", "uniform", profile=False),
        Arm("static filter (0 < rate < 1 at epoch 0)", "filter", {"reprofile": False}),
    ]
    bounds = (0.3, 0.5, 0.7) if quick else (0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    for b in bounds:
        out.append(Arm(f"filter b={b}", "filter", {"solved": b, "unsolved": b}))
    if not quick:
        for solved, unsolved in ((0.3, 0.5), (0.5, 0.3), (0.2, 0.5), (0.5, 0.2)):
            name = f"filter solved={solved} unsolved={unsolved}"
            out.append(Arm(name, "filter", {"solved": solved, "unsolved": unsolved}))
        for b in (0.3, 0.5):
            out.append(
                Arm(f"static filter b={b}", "filter", {"solved": b, "unsolved": b, "reprofile": False})
            )
    rechecks = (0.05, 0.1) if quick else (0.02, 0.05, 0.1, 0.2)
    for b in (0.5,) if quick else (0.3, 0.5, 0.7):
        for r in rechecks:
            out.append(Arm(f"filter b={b} recheck={r}", "filter", {"solved": b, "unsolved": b, "recheck": r}))
    for decay in (0.5,) if quick else (0.9, 0.7, 0.5):
        for r in (0.0, 0.1):
            out.append(
                Arm(
                    f"filter b=0.5 recheck={r} beta_decay={decay}",
                    "filter",
                    {"recheck": r},
                    beta_decay=decay,
                )
            )
    for strategy, params in (
        ("insight", {}),
        ("insight", {"mu": 0.5}),
        ("mopps", {}),
        ("expected_difficulty", {}),
        ("dps", {}),
        ("learnability", {}),
    ):
        label = strategy + ("" if not params else " " + ",".join(f"{k}={v}" for k, v in params.items()))
        out.append(Arm(label, strategy, params))
        out.append(Arm(f"{label} + filter", strategy, params, filter={}))
        if not quick:
            out.append(Arm(f"{label} + filter recheck=0.1", strategy, params, filter={"recheck": 0.1}))
    out.append(Arm("dps cold", "dps", profile=False))
    out.append(Arm("dps cold + filter", "dps", filter={}, profile=False))
    return out


def replay(trace: Trace, arm: Arm, batch: int, seed: int) -> dict[str, Any]:
    n, k = trace.n_prompts, trace.rollouts
    key = f"filter-trace-{seed}"
    beliefs = BeliefArrays.new(n, 1.0, 1.0)
    profiling = 0
    if arm.profile:
        rates = trace.successes[:, 0] / k
        apply_metadata(beliefs, 0, rates, None, np.full(n, k, dtype=np.int32), True)
        profiling = int(beliefs.shared.profile_rollouts)
    mixed = np.zeros(trace.n_epochs - 1, dtype=np.int64)
    for epoch in range(1, trace.n_epochs):
        step = epoch - 1
        ids, _ = select(
            beliefs,
            strategy=arm.strategy,
            params=arm.params,
            batch_size=batch,
            step=step,
            seed=seed,
            key=key,
            dataset_k=k,
            filter=arm.filter,
        )
        succ = trace.successes[ids, epoch].astype(np.float64)
        trials = np.full(ids.size, float(k))
        apply_results(
            beliefs, ids, succ, trials, outcomes_from_counts(succ, trials), arm.beta_decay, 1.0, 1.0
        )
        close_open_step(beliefs, hmm_decay=0.7, key=key)
        mixed[step] = int(((succ > 0) & (succ < k)).sum())
    settings = arm.settings()
    kept = None
    if settings is not None:
        kept = int((judge(beliefs, np.arange(n), Filter.of(settings, k)) == KEEP).sum())
    rollouts = batch * k * (trace.n_epochs - 1)
    return {"mixed": mixed, "profiling": profiling, "rollouts": rollouts, "kept": kept}


def _mean_se(values: Sequence[float]) -> dict[str, float]:
    x = np.asarray(values, dtype=np.float64)
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
    return {"mean": round(float(x.mean()), 4), "se": round(se, 4)}


def summarize(runs: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    esr = [r["mixed"].sum() / (batch * r["mixed"].size) for r in runs]
    last = [r["mixed"][-10:].sum() / (batch * min(10, r["mixed"].size)) for r in runs]
    per_rollout = [r["mixed"].sum() / (r["rollouts"] + r["profiling"]) for r in runs]
    out = {
        "esr": _mean_se(esr),
        "esr_last10": _mean_se(last),
        "mixed_per_rollout": _mean_se(per_rollout),
        "profiling_rollouts": runs[0]["profiling"],
        "rollouts": runs[0]["rollouts"],
    }
    if runs[0]["kept"] is not None:
        out["kept_at_end"] = _mean_se([r["kept"] for r in runs])
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, nargs="?", default=DEFAULT_TRACE, help=f"the trace ({SOURCE})")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128, help="prompts picked per epoch")
    parser.add_argument("--quick", action="store_true", help="a few arms (for a smoke run)")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    trace = load_trace(args.path)
    started = time.perf_counter()
    results: dict[str, Any] = {}
    print(
        f"{trace.n_prompts} prompts, epochs 1..{trace.n_epochs - 1} after the epoch-0 profile, "
        f"B = {args.batch_size}, {args.seeds} seeds"
    )
    print("| arm | ESR | last 10 epochs | mixed groups per rollout, profile counted | kept at the end |")
    print("|---|---|---|---|---|")
    for arm in arms(args.quick):
        runs = [replay(trace, arm, args.batch_size, seed) for seed in range(args.seeds)]
        s = summarize(runs, args.batch_size)
        results[arm.name] = {"arm": arm.__dict__, **s}
        kept = s.get("kept_at_end")
        print(
            f"| {arm.name} | {s['esr']['mean']:.3f} ± {s['esr']['se']:.3f} "
            f"| {s['esr_last10']['mean']:.3f} ± {s['esr_last10']['se']:.3f} "
            f"| {s['mixed_per_rollout']['mean']:.4f} | {'' if kept is None else round(kept['mean'])} |",
            flush=True,
        )
    seconds = time.perf_counter() - started
    line = {
        "benchmark": "filter_trace",
        "prompts": trace.n_prompts,
        "epochs": trace.n_epochs,
        "batch_size": args.batch_size,
        "seeds": args.seeds,
        "seconds": round(seconds, 1),
        # The default filter's and the static filter's share of groups with signal, and uniform's.
        "filter_esr": results["filter b=0.5"]["esr"]["mean"],
        "static_filter_esr": results["static filter (0 < rate < 1 at epoch 0)"]["esr"]["mean"],
        "uniform_esr": results["uniform"]["esr"]["mean"],
        "results": {
            name: {m: r[m]["mean"] for m in ("esr", "esr_last10", "mixed_per_rollout")}
            for name, r in results.items()
        },
    }
    emit({**line, "detail": results}, args.out / "filter_trace.json")
    return line


if __name__ == "__main__":
    main()
