"""`selector-service replay LOG`: what each strategy, and the pass-rate filter, would have found in a run.

Prints a table, the recommendation for a run of this shape (rlvr_selector_client.recommend) and, as its
last line, one JSON object; writes a plot and the per-epoch detail to --out once everything has run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from selector_service.replay.logs import FORMATS, Columns, LogError, RunLog, read_log
from selector_service.replay.protocol import (
    Arm,
    ArmResult,
    EpochTable,
    epochs_of,
    is_mixed,
    replay,
)

__all__ = ["DESCRIPTION", "EPILOG", "add_arguments", "run"]

EXIT_OK, EXIT_SERVICE, EXIT_INPUT = 0, 2, 3

DESCRIPTION = """\
Replay a past run's per-prompt outcomes through the service: how many of its groups carried a learning
signal, and how many each strategy, and the pass-rate filter, would have found in the same logs.

The protocol. A log tells a prompt's outcome only at the steps the run rolled it out, so the replay goes
epoch by epoch, an epoch being the stretch in which the run saw its pool once (a new epoch starts at the
first step holding a prompt the epoch already saw; --epoch-steps gives it). At each epoch every arm picks
B of the prompts the epoch observed (--batch-size; default the run's own: the prompts a step of the log
holds) before it sees the epoch, then sees the real outcomes of its picks and nothing else, with the
group sizes the log has. The first epoch is the profile: the filters and every NAME+profile arm see it
whole first (uploaded as pass rates, each with its samples, profile: true) and its rollouts, as the
service counts them, count against them; the other arms pick from it like any epoch.

The arms, each run on the service (a dataset of its own on the embedded store, in a temporary folder)
but one: uniform; filter (the static filter teams run: the service's strategy filter on the profile
alone, keeping exactly the prompts mixed in it, neither all solved nor all failed); filter_reprofile (the
service's strategy filter at its defaults: the same profile, then re-profiled by the run's outcomes);
filter_latest_outcome (a prompt dropped or readmitted by its latest group alone, a rule the service's
filter does not express, run by the replay itself); every other strategy the service offers (GET
/strategies), each as NAME and NAME+profile, and with --filter also NAME+filter and NAME+profile+filter
(the select-time filter on top).

The result: the effective-sample ratio (ESR: the share of picked groups with both a success and a
failure, GRPO's learning signal) over epochs 1 on and over the last epochs, effective groups per rollout
with the profile counted, and their ratios to uniform and to the filter. Whether more signal means faster
learning is not measured here (docs/strategies.md measures it); docs/replay.md says how to read it."""

EPILOG = """\
Formats: rows of {"step", "prompt_id", "rewards": [...]} or {"step", "prompt_id", "successes", "trials"}
as JSONL or parquet (other column names with --prompt-column, --step-column, --reward-column; one reward
per row = one rollout per row; prompts given as text are identified by a hash of it); verl's rollout dump
(the trainer.rollout_data_dir folder); a JSON object {prompt: [accuracy per epoch]} (--trials rollouts
each). Exit status: 0 done, 2 the service could not start or failed, 3 the log or an option is refused."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "log",
        type=Path,
        help="the run's log: a JSONL or parquet file, a verl rollout dump folder, or an accuracy JSON",
    )
    p.add_argument(
        "--format", choices=FORMATS, default="auto", help="the log's format (default: told by the file)"
    )
    p.add_argument(
        "--prompt-column",
        help="the column that names the prompt: its integer id or its text (default prompt_id; verl: input)",
    )
    p.add_argument("--step-column", help="the column holding the training step (default step)")
    p.add_argument(
        "--reward-column",
        help="the column holding a group's rewards, or one rollout's reward (default rewards; verl: score)",
    )
    p.add_argument(
        "--successes-column",
        help="with --trials-column, instead of rewards: a group's successes (default successes)",
    )
    p.add_argument("--trials-column", help="a group's rollouts (default trials)")
    p.add_argument(
        "--success-threshold",
        type=float,
        default=1.0,
        help="a rollout succeeds when its reward is >= this, as in /observe (default 1.0)",
    )
    p.add_argument(
        "--trials", type=int, default=8, help="an accuracy file's rollouts per prompt per epoch (default 8)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        help="B, the prompts each arm picks per epoch (default: the run's own batch)",
    )
    p.add_argument("--epoch-steps", type=int, help="steps per epoch (default: detected)")
    p.add_argument("--epochs", type=int, help="replay only the first E epochs (default: all)")
    p.add_argument(
        "--last", type=int, default=10, help="the last epochs the ESR is also reported over (default 10)"
    )
    p.add_argument(
        "--arms", help="a comma list of arms to run (default: all); e.g. uniform,filter,insight+profile"
    )
    p.add_argument(
        "--filter",
        nargs="?",
        const="{}",
        metavar="JSON",
        help="also run every strategy with a select's filter object, as NAME+filter and NAME+profile+filter "
        '(e.g. \'{"solved": 0.3, "unsolved": 0.3}\'; without a value the service\'s defaults, {})',
    )
    p.add_argument("--seed", type=int, default=0, help="the seed of every random pick (default 0)")
    p.add_argument(
        "--out", type=Path, help="folder for replay.png and replay.json (default ./replay-<log name>)"
    )
    p.add_argument("--no-plot", action="store_true", help="skip the plot")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


class _Refused(Exception):
    """An option the log cannot honour: said in one line, exit 3."""


def _columns(args: argparse.Namespace, fmt: str) -> Columns | None:
    given = {
        "prompt": args.prompt_column,
        "step": args.step_column,
        "rewards": args.reward_column,
        "successes": args.successes_column,
        "trials": args.trials_column,
    }
    if all(v is None for v in given.values()):
        return None
    from selector_service.replay.logs import VERL_COLUMNS

    base = VERL_COLUMNS if fmt == "verl" else Columns()
    return Columns(**{k: v if v is not None else getattr(base, k) for k, v in given.items()})


def _filter_settings(text: str | None) -> dict[str, Any] | None:
    """--filter's object, checked as the service checks a select's filter; _Refused naming what is wrong."""
    if text is None:
        return None
    from selector_service.core.strategies import ParamError, validate_filter

    try:
        settings = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Refused(
            f"--filter is not JSON ({exc}): give an object, e.g. '{{\"recheck\": 0.02}}'"
        ) from None
    if not isinstance(settings, dict):
        raise _Refused(f"--filter must be a JSON object, e.g. '{{\"recheck\": 0.02}}', not {text}")
    try:
        validate_filter(settings)
    except ParamError as exc:
        raise _Refused(f"--filter: {exc}") from None
    return settings


def _choose(wanted: str | None, available: list[str]) -> list[str]:
    if not wanted:
        return available
    names = [w.strip() for w in wanted.split(",") if w.strip()]
    unknown = [n for n in names if n not in available]
    if unknown:
        from selector_service.replay.arms import FILTER

        hint = " (give --filter for the +filter arms)" if any(n.endswith(FILTER) for n in unknown) else ""
        raise _Refused(f"unknown arm {', '.join(unknown)}{hint}: the arms are {', '.join(available)}")
    return [n for n in available if n in names]


# ---- the result -------------------------------------------------------------------------------------------
def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def summarize(
    results: list[ArmResult], n_epochs: int, last: int, run_rollouts: int
) -> dict[str, dict[str, Any]]:
    """Per arm that ran: esr (epochs 1 on), esr_last (the last `last` epochs), effective_per_rollout (its
    profile charged against a run of `run_rollouts`, protocol.py) and its per-epoch detail."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        if r.skipped is not None:
            continue
        out[r.name] = {
            "esr": r.esr(slice(1, n_epochs)),
            "esr_last": r.esr(slice(n_epochs - last, n_epochs)),
            "effective_per_rollout": r.effective_per_rollout(run_rollouts),
            "groups": int(r.groups.sum()),
            "rollouts": int(r.rollouts.sum()),
            "profile_rollouts": r.profile_rollouts,
            "esr_per_epoch": r.esr_curve(),
        }
    base = out["uniform"]["effective_per_rollout"] if "uniform" in out else None
    flt = out["filter"]["effective_per_rollout"] if "filter" in out else None
    for s in out.values():
        s["vs_uniform"] = _ratio(s["effective_per_rollout"], base)
        s["vs_filter"] = _ratio(s["effective_per_rollout"], flt)
    return out


def run_itself(table: EpochTable, last: int) -> dict[str, Any]:
    """The run as it was: every group of every epoch (no profile)."""
    mixed = np.array([int(is_mixed(e.successes, e.trials).sum()) for e in table.epochs])
    groups = np.array([e.size for e in table.epochs])
    rollouts = sum(int(e.trials.sum()) for e in table.epochs)
    n = table.n_epochs
    return {
        "esr": float(mixed[1:].sum() / groups[1:].sum()),
        "esr_last": float(mixed[n - last :].sum() / groups[n - last :].sum()),
        "effective_per_rollout": float(mixed.sum() / rollouts),
        "groups": int(groups.sum()),
        "rollouts": rollouts,
        "esr_per_epoch": (mixed / groups).tolist(),
    }


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_table(summary: dict[str, dict[str, Any]], itself: dict[str, Any], n_epochs: int, last: int) -> str:
    run = itself["rollouts"]
    lines = [
        f"| arm | ESR, epochs 1-{n_epochs - 1} | ESR, last {last} | effective groups / rollout | vs uniform "
        "| vs filter | rollouts picked | profile (share of the run) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        profile = s["profile_rollouts"]
        shown = f"{profile:,} ({profile / run:.1%})" if profile else "-"
        lines.append(
            f"| {name} | {_fmt(s['esr'])} | {_fmt(s['esr_last'])} | {_fmt(s['effective_per_rollout'], 4)} | "
            f"{_fmt(s['vs_uniform'], 2)} | {_fmt(s['vs_filter'], 2)} | {s['rollouts']:,} | {shown} |"
        )
    lines.append(
        f"| (the run itself: every group) | {_fmt(itself['esr'])} | {_fmt(itself['esr_last'])} | "
        f"{_fmt(itself['effective_per_rollout'], 4)} | | | {run:,} | - |"
    )
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, Any]], itself: dict[str, Any], path: Path, title: str) -> None:
    """ESR per epoch of each arm: the arms without a profile on the left, with it on the right, the
    baselines (uniform, the filters, the run itself) on both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from selector_service.replay.arms import BASELINES, FILTER, PROFILE

    baselines = list(BASELINES)
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.2), sharey=True)
    styles = {
        "uniform": ("black", "-"),
        "filter": ("tab:grey", "--"),
        "filter_reprofile": ("tab:grey", ":"),
        "filter_latest_outcome": ("tab:grey", "-."),
    }
    others = [n for n in summary if n not in baselines]

    def strategy(name: str) -> str:
        return name.removesuffix(FILTER).removesuffix(PROFILE)

    palette = matplotlib.colormaps["tab20"]
    colors = {s: palette(i % 20) for i, s in enumerate(dict.fromkeys(strategy(o) for o in others))}
    for ax, profiled in zip(axes, (False, True), strict=True):
        ax.plot(itself["esr_per_epoch"], color="tab:brown", lw=1, alpha=0.6, label="the run itself")
        for name, s in summary.items():
            curve = [np.nan if v is None else v for v in s["esr_per_epoch"]]
            if name in baselines:
                color, style = styles.get(name, ("black", "-"))
                ax.plot(curve, style, color=color, lw=1.8, label=name)
            elif (PROFILE in name) == profiled:
                style = "--" if name.endswith(FILTER) else "-"
                ax.plot(curve, style, color=colors[strategy(name)], lw=1.2, label=name)
        ax.set(
            xlabel="epoch",
            title="with the first epoch as profile" if profiled else "without a profile",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    axes[0].set_ylabel("effective-sample ratio (mixed groups / groups picked)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)


def _write_atomically(target: Path, write: Callable[[Path], object]) -> Path:
    """Write through `write` into a temporary file beside `target`; return it (renamed by the caller)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


# ---- the command ------------------------------------------------------------------------------------------
def _read(args: argparse.Namespace) -> tuple[RunLog, EpochTable]:
    from selector_service.replay.logs import detect_format

    fmt = args.format
    if fmt == "auto" and args.log.exists():
        fmt = detect_format(args.log)
    log = read_log(
        args.log,
        fmt=fmt,
        columns=_columns(args, fmt),
        success_threshold=args.success_threshold,
        trials=args.trials,
    )
    return log, epochs_of(log, epoch_steps=args.epoch_steps, epochs=args.epochs)


def run(args: argparse.Namespace, service_url: str | None = None) -> int:
    """The command (module docstring). `service_url`: replay on a service already running instead of
    starting one (it gets datasets named replay-*, deleted afterwards)."""
    try:
        log, table = _read(args)
        batch = args.batch_size if args.batch_size is not None else table.run_batch_size
        if not 1 <= batch <= table.n_prompts:
            raise _Refused(
                f"--batch-size must lie in 1..{table.n_prompts} (the prompts in the log), got {batch}"
            )
        if args.last < 1:
            raise _Refused(f"--last must be >= 1, got {args.last}")
        if not args.no_plot and importlib.util.find_spec("matplotlib") is None:
            raise _Refused(
                "the plot needs matplotlib: pip install 'rlvr-selector[replay]', or give --no-plot"
            )
        last = min(args.last, table.n_epochs - 1)
        filter_settings = _filter_settings(args.filter)
    except (LogError, _Refused) as exc:
        print(f"selector-service replay: {exc}", file=sys.stderr)
        return EXIT_INPUT
    from rlvr_selector_client.client import SelectorClient, SelectorError
    from selector_service.replay.arms import arm_names, build_arm
    from selector_service.replay.service import embedded_service

    out = (
        args.out
        if args.out is not None
        else Path(f"replay-{args.log.name.removesuffix(args.log.suffix) or 'log'}")
    )
    print(
        f"{log.source}: {log.rows:,} rows, {log.n_groups:,} groups of {log.n_prompts:,} prompts, "
        f"{table.n_epochs} epochs; B = {batch}" + (" (the run's own)" if args.batch_size is None else ""),
        flush=True,
    )
    for note in table.notes:
        print(f"note: {note}", flush=True)
    if table.repeats_left_out:
        print(
            f"note: {table.repeats_left_out} groups of prompts seen again within an epoch left out",
            flush=True,
        )
    try:
        service: AbstractContextManager[str] = nullcontext(service_url) if service_url else embedded_service()
        with service as url, SelectorClient(url, timeout=120.0) as client:
            names = _choose(args.arms, arm_names(list(client.strategies()), filter_settings is not None))
            arms: list[Arm] = [build_arm(n, client, args.seed, filter_settings) for n in names]
            total = sum(table.n_epochs - (1 if arm.profile else 0) for arm in arms)
            with _progress(total, args.no_progress) as advance:
                results = replay(table, arms, batch, progress=advance)
    except _Refused as exc:
        print(f"selector-service replay: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except (RuntimeError, SelectorError) as exc:
        print(f"selector-service replay: {exc}", file=sys.stderr)
        return EXIT_SERVICE
    return _report(args, log, table, batch, last, results, out)


def _report(
    args: argparse.Namespace,
    log: RunLog,
    table: EpochTable,
    batch: int,
    last: int,
    results: list[ArmResult],
    out: Path,
) -> int:
    from rlvr_selector_client.recommend import Known, recommend

    n_epochs = table.n_epochs
    itself = run_itself(table, last)
    summary = summarize(results, n_epochs, last, itself["rollouts"])
    visits = log.n_groups / log.n_prompts
    rec = recommend(log.n_prompts, visits, batch, Known.profile(table.profile_samples))
    ran = {n: s for n, s in summary.items() if s["effective_per_rollout"] is not None}
    best = max(ran, key=lambda n: ran[n]["effective_per_rollout"]) if ran else None
    detail = {
        "log": log.source,
        "format": log.format,
        "rows": log.rows,
        "prompts": log.n_prompts,
        "epochs": n_epochs,
        "batch_size": batch,
        "last": last,
        "seed": args.seed,
        "epoch_steps": [[e.first_step, e.last_step] for e in table.epochs],
        "profile_samples": table.profile_samples,
        "run_itself": itself,
        "arms": summary,
        "skipped": {r.name: r.skipped for r in results if r.skipped is not None},
        "recommended": {"arm": rec.arm, "strategy": rec.strategy, "params": rec.params,
                        "prior_strength": rec.prior_strength, "why": rec.why},
        "best_measured": best,
    }  # fmt: skip
    json_path, png_path = out / "replay.json", out / "replay.png"
    title = (
        f"{Path(log.source).name}: {log.n_prompts:,} prompts, {n_epochs} epochs, B = {batch} picks per "
        f"epoch (seed {args.seed})"
    )
    pending: list[tuple[Path, Path]] = []
    try:  # every file is written in full beside its target, then all are renamed: nothing half-written
        pending.append(
            (
                _write_atomically(json_path, lambda p: p.write_text(json.dumps(detail, indent=1) + "\n")),
                json_path,
            )
        )
        if not args.no_plot:
            pending.append((_write_atomically(png_path, lambda p: plot(summary, itself, p, title)), png_path))
    except BaseException:
        for tmp, _ in pending:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, target in pending:
        os.replace(tmp, target)
    print()
    print(format_table(summary, itself, n_epochs, last))
    for name, why in detail["skipped"].items():
        print(f"skipped {name}: {why}")
    print(
        f"\nrecommended for {log.n_prompts:,} prompts seen {visits:.1f} times, B = {batch}, a profile of "
        f"{table.profile_samples:g} samples: {rec.arm}"
        + (f" with {rec.params}" if rec.params else "")
        + (f", prior_strength {rec.prior_strength:g}" if rec.prior_strength is not None else "")
        + f" ({rec.why})"
    )
    if best is not None:
        print(f"most effective groups per rollout here: {best}")
    print(f"wrote {json_path}" + ("" if args.no_plot else f" and {png_path}"))
    line = {
        "epochs": n_epochs,
        "prompts": log.n_prompts,
        "batch_size": batch,
        "arms": {
            n: {k: s[k] for k in ("esr", "esr_last", "effective_per_rollout")} for n, s in summary.items()
        },
        "recommended": rec.arm,
    }
    print(json.dumps(line), flush=True)
    return EXIT_OK


class _progress:
    """A tqdm bar over the arms' epochs, on stderr; yields the callback `replay` advances."""

    def __init__(self, total: int, disable: bool) -> None:
        self.total, self.disable = total, disable
        self.bar: Any = None

    def __enter__(self) -> Callable[[str], None]:
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover - the replay extra installs it
            return lambda name: None
        self.bar = tqdm(total=self.total, desc="replay", unit="epoch", disable=self.disable, file=sys.stderr)

        def advance(name: str) -> None:
            self.bar.set_postfix_str(name, refresh=False)
            self.bar.update(1)

        return advance

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
