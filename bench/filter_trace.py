"""The filter's defaults, measured on a real run's outcomes: which bounds, re-check share and forgetting keep
the most learning signal per rollout, profiling counted?

    python bench/filter_trace.py PATH [--seeds 5] [--batch-size 128] [--quick]

PATH is the One-Shot-RLVR trace (`data/acc_step_500.json` of github.com/ypwang61/One-Shot-RLVR, Apache-2.0;
bench/rollout_trace.py describes it): the training accuracy of each of 1,209 DeepScaleR prompts at every
epoch of a 500-step GRPO run, 8 rollouts per prompt per epoch.

Every arm runs through the product's replay (selector_service.replay, what `selector-service replay`
runs; docs/replay.md states the protocol), on one service started on its embedded store: the trace is
read and cut into epochs by the command's reader, and each arm, per seed, is a configuration of the
service (a dataset of its own) that the replay loop drives over REST:

1. Profile: epoch 0's outcomes are uploaded as every prompt's pass rate with its sample count, 8
   (``pass_samples``, ``profile: true``): 1,209 x 8 = 9,672 profiling rollouts, counted by the service
   (its ``profile_rollouts``). Arms marked cold upload nothing (and spend nothing) and, as in the
   command, pick from epoch 0 on.
2. Epochs 1..E-1: the arm's select picks B prompts (strategy ``filter`` with the arm's settings as its
   params, or a strategy with a select's ``filter`` object), each picked prompt's group is that epoch's
   8 real outcomes, reported with /observe.

`uniform`, the static filter and the default filter are the command's arms `uniform`, `filter` and
`filter_reprofile` (selector_service/replay/arms.py: the same configuration and dataset name, so at seed 0
the same picks), and the filter by the latest group alone is its `filter_latest_outcome`. The rest sweep
the bounds, the re-check share and forgetting (the dataset's beta_decay), and put each strategy with the
profile beside itself under the default filter.

Reported per arm, mean ± standard error over seeds, over epochs 1..E-1: the effective-sample ratio (ESR:
share of picked groups with a success and a failure, GRPO's learning signal), the same over the last 10
epochs, mixed groups per rollout with the profile counted (mixed groups over the arm's rollouts plus the
profile's), and how many prompts the filter keeps at the last epoch (the service's export judged by its
own filter code). A group here is the whole epoch's outcome of the prompt, so the only randomness is in
the picks (the walks, pools, re-checks and ties): the seeds say how much the choices of one arm vary.

Writes bench/out/filter_trace.json; ends stdout with one JSON line (docs/methods.md §9 cites it).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OUT_DIR, emit
from bench.rollout_trace import SOURCE
from rlvr_selector_client.client import SelectorClient
from selector_service.core.filter import KEEP, Filter, judge
from selector_service.core.strategies import validate_filter
from selector_service.replay.arms import build_arm
from selector_service.replay.logs import LogError, read_log
from selector_service.replay.protocol import (
    Arm,
    ArmResult,
    EpochTable,
    LatestOutcomeFilterArm,
    epochs_of,
    replay,
)
from selector_service.replay.service import ServiceArm, embedded_service
from selector_service.storage.snapshot import deserialize_snapshot

#: Where a checkout finds the trace by default: ../shared beside it (or beside its worktrees' folder).
_TRACE = Path("shared", "data", "one-shot-rlvr", "acc_step_500.json")
DEFAULT_TRACE = next(
    (p / _TRACE for p in Path(__file__).resolve().parents[2:4] if (p / _TRACE).is_file()),
    Path(__file__).resolve().parents[2] / _TRACE,
)
UNIFORM, STATIC, DEFAULT = "uniform", "static filter (0 < rate < 1 at epoch 0)", "filter b=0.5"
LATEST = "filter by the latest group alone"


@dataclass(frozen=True)
class Spec:
    """An arm of this benchmark: `replay_arm`, the command's arm of that name (`profile` says whether it
    uses the profile); else a configuration of the service (strategy, params, a select's filter,
    beta_decay, the profile or not)."""

    name: str
    strategy: str = "filter"
    params: dict[str, Any] = field(default_factory=dict)
    filter: dict[str, Any] | None = None
    beta_decay: float = 1.0
    profile: bool = True  # epoch 0's rates uploaded (and their rollouts counted)
    replay_arm: str | None = None

    def build(self, client: SelectorClient, seed: int) -> Arm:
        if self.replay_arm is not None:
            return build_arm(self.replay_arm, client, seed)
        return ServiceArm(
            client,
            self.strategy,
            profile=self.profile,
            seed=seed,
            params=self.params,
            filter=self.filter,
            settings=None if self.beta_decay == 1.0 else {"beta_decay": self.beta_decay},
            name=self.name,
            dataset="filter-trace-" + re.sub(r"[^A-Za-z0-9._-]+", "-", self.name).strip("-"),
        )


def arms(quick: bool) -> list[Spec]:
    out = [
        Spec(UNIFORM, profile=False, replay_arm="uniform"),
        Spec(STATIC, replay_arm="filter"),
        Spec(DEFAULT, replay_arm="filter_reprofile"),
        Spec(LATEST, replay_arm="filter_latest_outcome"),
    ]
    bounds = (0.3, 0.7) if quick else (0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8)
    for b in bounds:
        out.append(Spec(f"filter b={b}", params={"solved": b, "unsolved": b}))
    if not quick:
        for solved, unsolved in ((0.3, 0.5), (0.5, 0.3), (0.2, 0.5), (0.5, 0.2)):
            out.append(
                Spec(
                    f"filter solved={solved} unsolved={unsolved}",
                    params={"solved": solved, "unsolved": unsolved},
                )
            )
        for b in (0.3, 0.5):
            out.append(Spec(f"static filter b={b}", params={"solved": b, "unsolved": b, "reprofile": False}))
    rechecks = (0.05, 0.1) if quick else (0.02, 0.05, 0.1, 0.2)
    for b in (0.5,) if quick else (0.3, 0.5, 0.7):
        for r in rechecks:
            out.append(Spec(f"filter b={b} recheck={r}", params={"solved": b, "unsolved": b, "recheck": r}))
    for decay in (0.5,) if quick else (0.9, 0.7, 0.5):
        for r in (0.0, 0.1):
            out.append(
                Spec(f"filter b=0.5 recheck={r} beta_decay={decay}", params={"recheck": r}, beta_decay=decay)
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
        out.append(Spec(label, strategy, params))
        out.append(Spec(f"{label} + filter", strategy, params, filter={}))
        if not quick:
            out.append(Spec(f"{label} + filter recheck=0.1", strategy, params, filter={"recheck": 0.1}))
    out.append(Spec("dps cold", "dps", profile=False))
    out.append(Spec("dps cold + filter", "dps", filter={}, profile=False))
    return out


class KeptAtEnd:
    """An arm that, as it ends, counts the prompts its filter keeps: for a service arm, before its dataset
    is deleted, the dataset's export (GET /datasets/{name}/export) judged by the service's own filter
    code; for the latest-group filter, its kept set. Every other call goes to the arm."""

    def __init__(self, arm: Arm, url: str) -> None:
        self.arm, self.url = arm, url
        self.kept: int | None = None

    @property
    def name(self) -> str:
        return self.arm.name

    @property
    def profile(self) -> bool:
        return self.arm.profile

    @property
    def profile_rollouts(self) -> int:
        return self.arm.profile_rollouts

    def begin(self, table: EpochTable) -> None:
        self.arm.begin(table)

    def pick(self, epoch: int, candidates: np.ndarray, batch_size: int) -> np.ndarray:
        return self.arm.pick(epoch, candidates, batch_size)

    def see(self, epoch: int, ids: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        self.arm.see(epoch, ids, successes, trials)

    def end(self) -> None:
        arm = self.arm
        settings = None
        if isinstance(arm, ServiceArm) and arm.created:
            settings = arm.params if arm.strategy == "filter" else arm.filter
        if isinstance(arm, LatestOutcomeFilterArm):
            self.kept = int(arm.keep.sum())
        elif settings is not None:
            assert isinstance(arm, ServiceArm)
            answer = httpx.get(f"{self.url}/datasets/{arm.dataset}/export", timeout=60)
            answer.raise_for_status()
            beliefs = deserialize_snapshot(answer.content).arrays
            f = Filter.of(validate_filter(settings), arm.k)
            self.kept = int((judge(beliefs, np.arange(beliefs.n), f) == KEEP).sum())
        arm.end()


def describe(arm: Arm) -> dict[str, Any]:
    """What an arm ran, once it has run (the static filter's bounds are set from the profile)."""
    if isinstance(arm, KeptAtEnd):
        arm = arm.arm
    if isinstance(arm, ServiceArm):
        return {"strategy": arm.strategy, "params": arm.params, "filter": arm.filter,
                "settings": arm.settings, "profile": arm.profile, "dataset": arm.dataset}  # fmt: skip
    return {"replay_arm": arm.name, "profile": arm.profile}


@dataclass
class Runs:
    """A spec's runs, one per seed: the replay's result and the prompts its filter keeps at the end
    (None without a filter); what it ran."""

    results: list[ArmResult] = field(default_factory=list)
    kept: list[int | None] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)


def run(
    table: EpochTable,
    specs: Sequence[Spec],
    batch: int,
    seeds: int,
    url: str,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Runs]:
    """Each spec at each seed through the replay on the service at `url`."""
    out: dict[str, Runs] = {}
    with SelectorClient(url, timeout=120.0) as client:
        for spec in specs:
            runs = out.setdefault(spec.name, Runs())
            for seed in range(seeds):
                arm = KeptAtEnd(spec.build(client, seed), url)
                (result,) = replay(table, [arm], batch, progress=progress)
                if result.skipped is not None:
                    raise SystemExit(f"filter_trace: arm {spec.name}: {result.skipped}")
                runs.results.append(result)
                runs.kept.append(arm.kept)
                runs.config = describe(arm)
    return out


def _mean_se(values: Sequence[float]) -> dict[str, float]:
    x = np.asarray(values, dtype=np.float64)
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
    return {"mean": round(float(x.mean()), 4), "se": round(se, 4)}


def summarize(runs: Runs, last: int = 10) -> dict[str, Any]:
    """Over epochs 1.. (every arm picks there): ESR, ESR over the `last` epochs, mixed groups per rollout
    with the profile counted; the profile's and the picks' rollouts; the prompts kept at the end."""
    results = runs.results
    n = results[0].groups.size
    tail = slice(max(1, n - last), n)
    per_rollout = [int(r.mixed[1:].sum()) / (int(r.rollouts[1:].sum()) + r.profile_rollouts) for r in results]
    out: dict[str, Any] = {
        "esr": _mean_se([r.esr(slice(1, n)) or 0.0 for r in results]),
        "esr_last10": _mean_se([r.esr(tail) or 0.0 for r in results]),
        "mixed_per_rollout": _mean_se(per_rollout),
        "profiling_rollouts": results[0].profile_rollouts,
        "rollouts": int(results[0].rollouts[1:].sum()),
    }
    kept = [k for k in runs.kept if k is not None]
    if kept:
        out["kept_at_end"] = _mean_se(kept)
    return out


def load(path: Path) -> EpochTable:
    """The trace cut into epochs by `selector-service replay`'s reader (an accuracy file, 8 rollouts per
    prompt per epoch). SystemExit saying what is wrong."""
    if not path.is_file():
        raise SystemExit(f"filter_trace: no trace at {path}. The trace is {SOURCE}; pass its path.")
    try:
        return epochs_of(read_log(path, fmt="accuracy", trials=8))
    except LogError as error:
        raise SystemExit(f"filter_trace: {error}") from None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, nargs="?", default=DEFAULT_TRACE, help=f"the trace ({SOURCE})")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128, help="prompts picked per epoch")
    parser.add_argument("--quick", action="store_true", help="a few arms (for a smoke run)")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.batch_size < 1:
        parser.error("--seeds and --batch-size must be >= 1")
    table = load(args.path)
    specs = arms(args.quick)
    started = time.perf_counter()
    print(
        f"{table.n_prompts} prompts, epochs 1..{table.n_epochs - 1} after the epoch-0 profile, "
        f"B = {args.batch_size}, {args.seeds} seeds, {len(specs)} arms through the replay's service"
    )
    from tqdm import tqdm

    total = sum(table.n_epochs - (1 if s.profile else 0) for s in specs) * args.seeds
    with (
        embedded_service() as url,
        tqdm(total=total, desc="filter_trace", unit="epoch", file=sys.stderr) as bar,
    ):
        runs = run(table, specs, args.batch_size, args.seeds, url, progress=lambda name: bar.update(1))
    results: dict[str, Any] = {}
    print("| arm | ESR | last 10 epochs | mixed groups per rollout, profile counted | kept at the end |")
    print("|---|---|---|---|---|")
    for spec in specs:
        s = summarize(runs[spec.name])
        results[spec.name] = {"arm": {"name": spec.name, **runs[spec.name].config}, **s}
        kept = s.get("kept_at_end")
        print(
            f"| {spec.name} | {s['esr']['mean']:.3f} ± {s['esr']['se']:.3f} "
            f"| {s['esr_last10']['mean']:.3f} ± {s['esr_last10']['se']:.3f} "
            f"| {s['mixed_per_rollout']['mean']:.4f} | {'' if kept is None else round(kept['mean'])} |",
            flush=True,
        )
    seconds = time.perf_counter() - started
    line = {
        "benchmark": "filter_trace",
        "prompts": table.n_prompts,
        "epochs": table.n_epochs,
        "batch_size": args.batch_size,
        "seeds": args.seeds,
        "seconds": round(seconds, 1),
        # The default filter's and the static filter's share of groups with signal, and uniform's.
        "filter_esr": results[DEFAULT]["esr"]["mean"],
        "static_filter_esr": results[STATIC]["esr"]["mean"],
        "uniform_esr": results[UNIFORM]["esr"]["mean"],
        "results": {
            name: {m: r[m]["mean"] for m in ("esr", "esr_last10", "mixed_per_rollout")}
            for name, r in results.items()
        },
    }
    emit({**line, "detail": results}, args.out / "filter_trace.json")
    return line


if __name__ == "__main__":
    main()
