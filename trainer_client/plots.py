"""Learning curves from metrics JSONL files (one or several runs, e.g. one per strategy).

Eleven panels, three rows of four:

- outcomes: mean reward vs step, mean reward vs cumulative rollouts (what a run costs), and the
  greedy evaluation accuracy (when the runs recorded one);
- data: the effective ratio (share of groups with a GRPO signal) vs step, and the trainer/sampler
  log-prob mismatch per token (mean solid, max dashed; log scale) with its truncated importance
  weights' capped share;
- the update: KL (to the reference when the KL penalty is on, else the sampler-to-trainer KL),
  clip fraction, pre-clip gradient norm, and the policy's entropy;
- the group sizes (rollouts per prompt, which a rollout budget makes differ): their mean per step with
  the min and max dashed, and a histogram of every group of the run by size, mixed groups hatched.

A quantity a run did not record (an HF-backend run has no sampler log-probs, a run without the KL
penalty has no reference KL) is simply absent from its panel. There is deliberately no loss panel:
with one optimizer step per batch the ratio is 1 and the "loss" is ``-sum(A * length) / tokens``,
which does not depend on the model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "PANELS",
    "REQUIRED_FIELDS",
    "SIZES_PANEL",
    "build_figure",
    "load_metrics",
    "plot_runs",
    "size_totals",
]

# Panel title -> (record keys drawn in it, y label). Keys after the first are drawn dashed.
PANELS: dict[str, tuple[tuple[str, ...], str]] = {
    "reward vs step": (("mean_reward",), "mean reward (rollouts of the step)"),
    "reward vs cost": (("mean_reward",), "mean reward"),
    "evaluation (fixed prompt subset)": (("eval_accuracy",), "greedy accuracy"),
    "effective ratio": (("effective_ratio",), "share of groups with reward spread"),
    "trainer/sampler mismatch": (("mismatch_mean", "mismatch_max"), "|logp trainer - logp sampler| (nats)"),
    "truncated IS weights": (("tis_capped_frac", "tis_weight_mean"), "capped share / mean weight"),
    "KL": (("kl", "mismatch_kl"), "KL to reference / sampler-trainer KL"),
    "clip fraction and gradient norm": (("clip_frac", "grad_norm"), "clipped share / grad norm"),
    "entropy": (("entropy",), "mean per-token entropy (nats)"),
    "rollouts per prompt": (
        ("group_size_mean", "group_size_min", "group_size_max"),
        "group size (mean; min and max dashed)",
    ),
}
#: The panel with the histogram of group sizes over the whole run (from ``group_sizes``, ``mixed_by_size``).
SIZES_PANEL = "group sizes (all steps)"


#: What every step record holds for the plot (the other quantities are drawn when present).
REQUIRED_FIELDS = ("step", "mean_reward", "total_rollouts")


def load_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The step records of a metrics file (blank lines skipped). ``json.JSONDecodeError`` on a line
    that is not JSON; ``ValueError`` naming the line and the field when a record is not a step record
    with ``REQUIRED_FIELDS``."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record, dict):
                problem = "is not a JSON object"
            else:
                missing = [key for key in REQUIRED_FIELDS if key not in record]
                problem = f"has no field {', '.join(map(repr, missing))}" if missing else ""
            if problem:
                raise ValueError(
                    f"{path}, line {number} {problem}: `trainer-client plot` reads metrics files written by "
                    f"`trainer-client train --metrics-out` (one JSON object per step with "
                    f"{', '.join(REQUIRED_FIELDS)})"
                )
            records.append(record)
    return records


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[Any], list[float]]:
    points = [(r["step"], float(r[key])) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def size_totals(records: Sequence[dict[str, Any]], key: str = "group_sizes") -> dict[int, int]:
    """Groups per size summed over ``records`` (``key``: ``group_sizes`` or ``mixed_by_size``); empty
    for records written before group sizes were recorded."""
    totals: dict[int, int] = {}
    for record in records:
        for size, count in (record.get(key) or {}).items():
            totals[int(size)] = totals.get(int(size), 0) + int(count)
    return dict(sorted(totals.items()))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def build_figure(runs: Sequence[tuple[str, Sequence[dict[str, Any]]]], *, title: str = "") -> Any:
    """The matplotlib figure of ``runs`` (``(label, records)`` pairs); `plot_runs` saves it."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()

    figure, axes = plt.subplots(3, 4, figsize=(21, 11))
    names = [*PANELS, SIZES_PANEL]
    panels = dict(zip(names, axes.flat, strict=False))
    axes.flat[len(names)].set_axis_off()
    width = 0.8 / max(1, len(runs))
    all_sizes = sorted({k for _, records in runs for k in size_totals(records)})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (label, records) in enumerate(runs):
        if not records:
            continue
        color = colors[index % len(colors)]
        steps = [r["step"] for r in records]
        rewards = [r["mean_reward"] for r in records]
        panels["reward vs step"].plot(steps, rewards, marker=".", color=color, label=label)
        panels["reward vs cost"].plot(
            [r["total_rollouts"] for r in records], rewards, marker=".", color=color, label=label
        )
        evaluation = [(r["step"], r["eval_accuracy"]) for r in records if "eval_accuracy" in r]
        if evaluation and "eval_accuracy_initial" in records[0]:
            evaluation.insert(0, (records[0]["step"] - 1, records[0]["eval_accuracy_initial"]))
        if evaluation:
            panels["evaluation (fixed prompt subset)"].plot(
                *zip(*evaluation, strict=True), marker="o", color=color, label=label
            )
        for name in list(PANELS)[3:]:
            for position, key in enumerate(PANELS[name][0]):
                xs, ys = _series(records, key)
                if xs:
                    panels[name].plot(
                        xs,
                        ys,
                        marker=".",
                        color=color,
                        linestyle="-" if position == 0 else "--",
                        label=f"{label}: {key}",
                    )
        sizes, mixed = size_totals(records), size_totals(records, "mixed_by_size")
        if sizes:  # bars at the position of their size among every run's sizes, side by side per run
            offset = (index - (len(runs) - 1) / 2) * width
            xs = [all_sizes.index(k) + offset for k in sizes]
            bars = panels[SIZES_PANEL]
            bars.bar(xs, list(sizes.values()), width, color=color, alpha=0.5, label=label)
            bars.bar(xs, [mixed.get(k, 0) for k in sizes], width, color=color, hatch="//", fill=False,
                     edgecolor=color, label=f"{label}: mixed")  # fmt: skip
    for name, ax in panels.items():
        ax.set(title=name, xlabel="step", ylabel=PANELS[name][1] if name in PANELS else "groups")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.lines or ax.patches:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes, alpha=0.6)
    panels["reward vs cost"].set_xlabel("rollouts generated (cumulative)")
    panels["evaluation (fixed prompt subset)"].set_xlabel("step (-1: before training)")
    panels["effective ratio"].set_ylim(-0.02, 1.02)
    panels[SIZES_PANEL].set_xlabel("rollouts per prompt (hatched: mixed groups)")
    if all_sizes:
        panels[SIZES_PANEL].set_xticks(range(len(all_sizes)), [str(k) for k in all_sizes])
    mismatch = panels["trainer/sampler mismatch"]
    values = [y for line in mismatch.lines for y in line.get_ydata()]
    if values and min(values) > 0:  # from 1e-5 (float32 on both sides) to 0.1 (bf16): log scale
        mismatch.set_yscale("log")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def plot_runs(
    runs: Sequence[tuple[str, Sequence[dict[str, Any]]]], out: str | Path, *, title: str = ""
) -> Path:
    """Write a PNG with the curves of ``runs`` (``(label, records)`` pairs) to ``out``."""
    plt = _pyplot()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure = build_figure(runs, title=title)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out
