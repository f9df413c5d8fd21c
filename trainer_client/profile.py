"""Profiling, a counted phase (``trainer-client train --profile-samples N``): before the first step,
every prompt of the dataset gets N rollouts from the starting policy, through the run's own rollout
engine, prompt rendering, sampling settings and verifier (`Trainer.rollout`), and its pass rate (the
share of the N rewards at or above the dataset's success threshold) goes to the service with its N
samples and ``profile=True`` (docs/api.md section 2). The service then weighs each rate as N samples
(docs/methods.md §6) and counts N x prompts as the dataset's profiling rollouts: its summary, /history,
/ui and metrics show the run's total rollouts with them, and so do the trainer's step records
(``profile_rollouts``) and summary.

A dataset that already holds profiling rollouts (a resumed run) is not profiled again.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Profile", "profile_prompts", "profile_rollouts_of", "upload_profile"]


@dataclass(frozen=True)
class Profile:
    """A profile of every prompt: its pass rate from `samples` rollouts."""

    pass_rate: list[float]
    samples: int
    seconds: float

    @property
    def rollouts(self) -> int:
        """The rollouts the profile spent."""
        return self.samples * len(self.pass_rate)

    def summary(self) -> str:
        rates = self.pass_rate
        return (
            f"profile: {len(rates)} prompts x {self.samples} samples = {self.rollouts} rollouts in "
            f"{self.seconds:.1f} s; mean pass rate {sum(rates) / len(rates):.3f}, "
            f"{sum(r == 0.0 for r in rates)} prompts never solved, {sum(r == 1.0 for r in rates)} always"
        )


def profile_prompts(trainer: Any, samples: int, *, progress: bool = True) -> Profile:
    """`samples` rollouts of every prompt of `trainer`'s task with its engine's current policy (the
    starting one, before the first step), in engine calls of as many sequences as a training step's
    (B x K), scored by the task's verifier against the dataset's success threshold."""
    from tqdm import tqdm

    config = trainer.config
    count = len(trainer.task.problems)
    chunk = max(1, config.batch_size * config.rollouts // samples)
    started = time.perf_counter()
    rates: list[float] = []
    with tqdm(total=count, desc="profile", unit="prompt", disable=not progress, file=sys.stderr) as bar:
        for start in range(0, count, chunk):
            ids = list(range(start, min(start + chunk, count)))
            groups, _, _ = trainer.rollout(ids, samples)
            for group in groups:
                rates.append(sum(r >= trainer.threshold for r in group.rewards) / samples)
            bar.update(len(ids))
            bar.set_postfix(rollouts=samples * len(rates))
    return Profile(rates, samples, time.perf_counter() - started)


def upload_profile(client: Any, dataset: str, profile: Profile) -> Any:
    """Uploads `profile` as the dataset's profile: each rate with its samples, counted as profiling
    rollouts. Returns the MetadataAck (its ``profile_rollouts``: the dataset's now)."""
    return client.upload_metadata(
        dataset,
        pass_rate=profile.pass_rate,
        pass_samples=[profile.samples] * len(profile.pass_rate),
        profile=True,
    )


def profile_rollouts_of(client: Any, dataset: str) -> int:
    """The dataset's profiling rollouts as its summary reports them (0 from a service without them)."""
    summary = client.get_dataset(dataset).raw.get("summary") or {}
    return int(summary.get("profile_rollouts") or 0)
