"""The figure of bench/bench_scale.py: seconds per DPS step against dataset size."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from bench.scale.kernels import CLOSE_BYTES, SELECT_BYTES
from bench.scale.service import PAPER_STEP_S_1E7


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    kern = result["kernels"]
    all_n = [r["n"] for r in kern] or [1e5]
    for regime, color, label in (
        ("full", "C0", "every prompt observed"),
        ("sparse", "C2", "sparse: 1e5 ever observed"),
    ):
        rows = [r for r in kern if r["regime"] == regime]
        if not rows:
            continue
        xs = [r["n"] for r in rows]
        ax.plot(xs, [r["step_s"] for r in rows], "o-", color=color, label=f"close + DPS select, {label}")
        proj = result["projection_1e8"].get(regime, {})
        if "step_s" in proj and not proj.get("measured"):
            ax.plot([xs[-1], proj["n"]], [rows[-1]["step_s"], proj["step_s"]], ":", color=color)
            ax.plot([proj["n"]], [proj["step_s"]], "o", mfc="white", color=color, label="  10^8 projected")
    grid = np.logspace(math.log10(min(all_n)), 8, 50)
    ax.plot(
        grid,
        (CLOSE_BYTES + SELECT_BYTES) * grid / result["stream_bandwidth_gb_per_s"] / 1e9,
        "-",
        color="grey",
        lw=1,
        label=f"bandwidth floor, every prompt observed ({CLOSE_BYTES + SELECT_BYTES} B/prompt)",
    )
    ref = result["reference"]
    if ref:
        ax.plot(
            [r["n"] for r in ref],
            [r["step_s"] for r in ref],
            "s-",
            color="C3",
            label="dict-based reference sampler (measured)",
        )
        last = ref[-1]
        ax.plot(
            [last["n"], 1e8],
            [last["step_s"], last["step_s"] * 1e8 / last["n"]],
            ":",
            color="C3",
            label="  linear projection",
        )
    svc = result.get("service")
    if svc and "select_close_p50_ms" in svc:
        ax.plot(
            [svc["n"]],
            [(svc["select_close_p50_ms"]) / 1e3],
            "*",
            ms=14,
            color="C2",
            label="service: /select that closes a step (p50, HTTP)",
        )
    ax.plot([1e7], [PAPER_STEP_S_1E7], "X", ms=10, color="C1", label="DPS paper, reported (10^7)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("prompts in the dataset (N)")
    ax.set_ylabel("seconds per training step (selector side)")
    ax.set_title(f"DPS step cost vs dataset size ({result['cores']} cores)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
