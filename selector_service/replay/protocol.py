"""The replay protocol: a run's epochs, the arms, and the loop that shows each arm only its picks.

A log tells a prompt's outcome only at the steps the run rolled it out. So the replay goes epoch by
epoch, an epoch being the stretch in which the run saw its pool once (`epochs_of`): a new epoch starts
at the first step that holds a prompt the current epoch already saw, or every `epoch_steps` steps when
that is given. At each epoch every arm picks at most B of the prompts the epoch observed (B fixed for
the replay) before it sees anything of the epoch, then sees the real outcomes of its picks, and only
those, with the group sizes the log has.

Epoch 0 is the profile. An arm that uses it (`Arm.profile`) sees all of epoch 0 before the replay, and
its rollouts count against it (`Arm.profile_rollouts`: for an arm on the service, the service's count of
what was uploaded as profiling); it then picks from epoch 1 on. Every other arm picks from epoch 0 on, as a
run without a profile would. The effective-sample ratio (mixed groups over groups picked; a group is
mixed when it holds a success and a failure, GRPO's learning signal) is reported over epochs 1 on, the
stretch every arm picks in, and over the last epochs. Effective groups per rollout are an arm's mixed
groups over its rollouts, with the profile charged what it takes of a run of the log's budget: a run that
spends R rollouts and profiles first with P of them trains on R - P, so the figure is multiplied by
1 - P / R (`ArmResult.effective_per_rollout`). With B the whole epoch that is mixed groups over the arm's
rollouts plus P; with a smaller B the replay samples the run, and the profile is charged at the run's
scale, not at the sample's.

An arm is anything with `Arm`'s methods. The baselines and the service's strategies are arms of
selector_service/replay/arms.py, run through the service; the one arm defined here is
`LatestOutcomeFilterArm` (`filter_latest_outcome`), a rule teams run by hand that the service's filter
does not express: a prompt dropped or readmitted by its latest group alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from selector_service.replay.logs import LogError, RunLog

__all__ = [
    "Arm",
    "ArmResult",
    "ArmSkipped",
    "Epoch",
    "EpochTable",
    "LatestOutcomeFilterArm",
    "epochs_of",
    "is_mixed",
    "replay",
]


def is_mixed(successes: np.ndarray, trials: np.ndarray) -> np.ndarray:
    """Groups with a success and a failure (GRPO's advantage is non-zero): 0 < S < n."""
    return (successes > 0) & (successes < trials)


@dataclass(frozen=True)
class Epoch:
    """The groups of one epoch, one per prompt it observed, by prompt id."""

    ids: np.ndarray  # int64, sorted
    successes: np.ndarray  # int64
    trials: np.ndarray  # int64
    first_step: int
    last_step: int

    @property
    def size(self) -> int:
        return int(self.ids.size)

    def outcomes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Successes and trials of `ids`, each a prompt this epoch observed."""
        pos = np.searchsorted(self.ids, ids)
        if ids.size and (pos.max() >= self.ids.size or not np.array_equal(self.ids[pos], ids)):
            raise ValueError("an arm picked a prompt the epoch did not observe")
        return self.successes[pos], self.trials[pos]


@dataclass(frozen=True)
class EpochTable:
    """A run cut into epochs (`epochs_of`)."""

    n_prompts: int
    epochs: list[Epoch]
    #: The run's own batch: the median number of prompts a step of the log holds.
    run_batch_size: int
    #: Groups left out because an epoch given by `epoch_steps` held the prompt already.
    repeats_left_out: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def n_epochs(self) -> int:
        return len(self.epochs)

    @property
    def profile_samples(self) -> float:
        """Rollouts behind each rate of the profile (epoch 0): the median group size there."""
        return float(np.median(self.epochs[0].trials))

    def profile_rates(self) -> np.ndarray:
        """float64[N]: each prompt's pass rate in epoch 0, NaN for one it did not observe."""
        rates = np.full(self.n_prompts, np.nan)
        first = self.epochs[0]
        rates[first.ids] = first.successes / first.trials
        return rates


def epochs_of(log: RunLog, epoch_steps: int | None = None, epochs: int | None = None) -> EpochTable:
    """Cut `log` into epochs (module docstring): detected, or every `epoch_steps` steps of the log; only
    the first `epochs` when given. Raises LogError when fewer than two epochs remain."""
    if epoch_steps is not None and epoch_steps < 1:
        raise LogError(f"--epoch-steps must be >= 1, got {epoch_steps}")
    if epochs is not None and epochs < 2:
        raise LogError(f"--epochs must be >= 2 (the profile and an epoch to replay), got {epochs}")
    n = log.n_prompts
    bounds = np.flatnonzero(np.diff(log.steps)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [log.n_groups]))
    per_step = ends - starts
    run_batch = int(np.median(per_step))
    # The step index each epoch starts at.
    epoch_starts: list[int] = [0]
    if epoch_steps is not None:
        epoch_starts = list(range(0, starts.size, epoch_steps))
    else:
        stamp = np.full(n, -1, dtype=np.int64)  # the epoch that last saw each prompt
        current = 0
        for s in range(starts.size):
            ids = log.prompts[starts[s] : ends[s]]
            if (stamp[ids] == current).any():
                current += 1
                epoch_starts.append(s)
            stamp[ids] = current
    epoch_starts.append(starts.size)
    table: list[Epoch] = []
    left_out = 0
    for a, b in itertools.pairwise(epoch_starts):
        lo, hi = int(starts[a]), int(ends[b - 1])
        ids = log.prompts[lo:hi]
        # Within an epoch given by --epoch-steps a prompt may come twice: its first group stands.
        _, first = np.unique(ids, return_index=True)
        left_out += ids.size - first.size
        sel = lo + np.sort(first)
        order = np.argsort(log.prompts[sel], kind="stable")
        sel = sel[order]
        table.append(
            Epoch(
                ids=log.prompts[sel].copy(),
                successes=log.successes[sel].copy(),
                trials=log.trials[sel].copy(),
                first_step=int(log.steps[lo]),
                last_step=int(log.steps[hi - 1]),
            )
        )
    if epochs is not None:
        table = table[:epochs]
    if len(table) < 2:
        how = f"every {epoch_steps} steps" if epoch_steps else "a new epoch starts when a prompt comes again"
        raise LogError(
            f"{log.source}: the log holds {len(table)} epoch ({how}): the replay needs at least two, the "
            "first as the profile and one to replay; if the run's epochs are shorter, give --epoch-steps"
        )
    return EpochTable(n, table, run_batch, left_out, log.notes)


class ArmSkipped(Exception):
    """An arm cannot run on this log (the service refused its strategy, say); the message says why."""


class Arm(Protocol):
    """What picks a batch each epoch. The replay calls `begin` once, then for each epoch `pick` and
    `see`, and `end` at the end (also after a failure); it reads `profile_rollouts` after `end`."""

    name: str
    #: Sees epoch 0 whole before the replay (its rollouts count) and picks from epoch 1 on.
    profile: bool
    #: What the arm's profile cost in rollouts (0 without one), as counted by what ran it: the service's
    #: own count (its dataset's profile_rollouts) for an arm that runs there.
    profile_rollouts: int

    def begin(self, table: EpochTable) -> None: ...

    def pick(self, epoch: int, candidates: np.ndarray, batch_size: int) -> np.ndarray:
        """At most `batch_size` distinct ids among `candidates` (the prompts `epoch` observed, sorted)."""
        ...

    def see(self, epoch: int, ids: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None: ...

    def end(self) -> None: ...


def _draw(rng: np.random.Generator, pool: np.ndarray, k: int) -> np.ndarray:
    if k >= pool.size:
        return pool.copy()
    return np.sort(rng.choice(pool, size=k, replace=False))


class LatestOutcomeFilterArm:
    """The pass-rate filter re-profiled by each prompt's latest group alone: it starts from the prompts
    mixed in the profile (epoch 0), drops a prompt whose latest group in the replay came out all solved
    or all failed and readmits one that came out mixed; it picks uniformly among the kept prompts of an
    epoch, at most B, and when fewer are there, dropped ones fill the batch (uniformly): that re-check is
    how a dropped prompt is readmitted.

    The service's filter judges a belief that weighs every outcome (and the profile) instead, and its
    forgetting (beta_decay) relaxes toward the profile, not away from it: this rule is not one of its
    settings, so the replay runs it beside the service's `filter_reprofile`. Its profile is counted here,
    as the rollouts of epoch 0."""

    name = "filter_latest_outcome"
    profile = True

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.keep = np.zeros(0, dtype=bool)
        self.profile_rollouts = 0

    def begin(self, table: EpochTable) -> None:
        first = table.epochs[0]
        self.keep = np.zeros(table.n_prompts, dtype=bool)
        self.keep[first.ids] = is_mixed(first.successes, first.trials)
        self.profile_rollouts = int(first.trials.sum())

    def pick(self, epoch: int, candidates: np.ndarray, batch_size: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch, 2])
        kept = candidates[self.keep[candidates]]
        picks = _draw(rng, kept, batch_size)
        if picks.size < batch_size:
            dropped = candidates[~self.keep[candidates]]
            picks = np.sort(np.concatenate((picks, _draw(rng, dropped, batch_size - picks.size))))
        return picks

    def see(self, epoch: int, ids: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        self.keep[ids] = is_mixed(successes, trials)

    def end(self) -> None:
        pass


@dataclass
class ArmResult:
    """Per epoch: groups picked, mixed among them, rollouts spent; and the profile's rollouts."""

    name: str
    profile: bool
    groups: np.ndarray
    mixed: np.ndarray
    rollouts: np.ndarray
    profile_rollouts: int = 0
    skipped: str | None = None

    def esr(self, epochs: slice) -> float | None:
        groups = int(self.groups[epochs].sum())
        return int(self.mixed[epochs].sum()) / groups if groups else None

    def effective_per_rollout(self, run_rollouts: int) -> float | None:
        """Mixed groups per rollout of the arm's picks, with the profile charged the share of the run's
        budget it takes: x (1 - profile / `run_rollouts`), `run_rollouts` being what the run itself spent
        over the replayed epochs. A run of the log's budget that profiles first trains on the rest."""
        spent = int(self.rollouts.sum())
        if not spent:
            return None
        return int(self.mixed.sum()) / spent * (1.0 - self.profile_rollouts / run_rollouts)

    def esr_curve(self) -> list[float | None]:
        return [int(m) / int(g) if g else None for m, g in zip(self.mixed, self.groups, strict=True)]


def replay(
    table: EpochTable,
    arms: Sequence[Arm],
    batch_size: int,
    progress: Callable[[str], None] | None = None,
) -> list[ArmResult]:
    """Run every arm through the epochs of `table` (module docstring), B = `batch_size`. `progress` is
    called after each epoch of each arm with the arm's name. An arm that raises ArmSkipped is reported
    as skipped, with its message."""
    if batch_size < 1:
        raise ValueError(f"the batch size must be >= 1, got {batch_size}")
    n_epochs = table.n_epochs
    results = []
    for arm in arms:
        result = ArmResult(
            arm.name,
            arm.profile,
            np.zeros(n_epochs, dtype=np.int64),
            np.zeros(n_epochs, dtype=np.int64),
            np.zeros(n_epochs, dtype=np.int64),
        )
        first = 1 if arm.profile else 0
        done = 0
        try:
            arm.begin(table)
            for e in range(first, n_epochs):
                epoch = table.epochs[e]
                want = min(batch_size, epoch.size)
                picks = np.asarray(arm.pick(e, epoch.ids, want), dtype=np.int64)
                _check_picks(arm.name, e, picks, epoch, want)
                successes, trials = epoch.outcomes(picks)
                arm.see(e, picks, successes, trials)
                result.groups[e] = picks.size
                result.mixed[e] = int(is_mixed(successes, trials).sum())
                result.rollouts[e] = int(trials.sum())
                done += 1
                if progress is not None:
                    progress(arm.name)
        except ArmSkipped as exc:
            result.skipped = str(exc)
            if progress is not None:
                for _ in range(n_epochs - first - done):
                    progress(arm.name)
        finally:
            arm.end()
        result.profile_rollouts = int(arm.profile_rollouts)
        results.append(result)
    return results


def _check_picks(name: str, epoch: int, picks: np.ndarray, observed: Epoch, want: int) -> None:
    """The protocol's invariants: at most B distinct prompts, each observed in the epoch."""
    if picks.ndim != 1 or picks.size > want:
        raise ValueError(f"arm {name} picked {picks.size} prompts at epoch {epoch}; at most {want} allowed")
    if np.unique(picks).size != picks.size:
        raise ValueError(f"arm {name} picked a prompt twice at epoch {epoch}")
    if picks.size and not np.isin(picks, observed.ids).all():
        raise ValueError(f"arm {name} picked a prompt that epoch {epoch} did not observe")
