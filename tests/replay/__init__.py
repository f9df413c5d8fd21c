"""Tests of `selector-service replay` (selector_service/replay) and the recommendation rule it prints."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def one_shot_trace() -> Path | None:
    """One-Shot-RLVR's acc_step_500.json in the ``shared/data`` folder beside the checkout (or beside a
    folder holding it, as for a git worktree), None when it is not there."""
    for base in ROOT.parents:
        path = base / "shared" / "data" / "one-shot-rlvr" / "acc_step_500.json"
        if path.is_file():
            return path
    return None
