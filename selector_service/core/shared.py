"""A dataset's constants (`DatasetRules`) and what it keeps beside its per-prompt arrays (`SharedState`).

The rules are fixed when the dataset is created (state.DatasetSpec.rules, from its spec): how its Beta
prior, its cold start (docs/methods.md §6) and the dataset-level parameters of its strategies (§7) shape
the state below.

The shared state holds the group sums of cold start (S_g, T_g and each group's size: coldstart.py), the
per-dataset state of the strategies of docs/methods.md §7 (GRESO's p_easy / p_hard and walk position,
SEC's Q values and per-category walk positions, AdaRFT's target difficulty T), the statistics of the
open step they are updated from when it closes (step_close.close_shared), and the metadata counts
(prompts with a pass rate, a sample count, a group; the profiling rollouts).

Nothing here reads a prompt: the per-prompt arrays (beliefs.BeliefArrays) hold a SharedState, and the
modules above both read and move it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from rlvr_selector_client.contract import DEFAULTS

from .domain import MAX_GROUPS, settings_problems

__all__ = [
    "GROUP_FIELDS",
    "SCALARS",
    "STEP_EASY",
    "STEP_HARD",
    "STEP_RESULTS",
    "STEP_SUCCESSES",
    "STEP_TRIALS",
    "DatasetRules",
    "SharedState",
]

#: Order of SharedState.step_counts: results applied at the open step, of which all-solved and
#: all-failed (states SOLVED / UNSOLVED), and their summed successes and trials.
STEP_RESULTS, STEP_EASY, STEP_HARD, STEP_SUCCESSES, STEP_TRIALS = range(5)


def _finite(name: str, value: float, low: float, high: float, *, low_open: bool = False) -> float:
    value = float(value)
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    if not ok:
        bound = "(" if low_open else "["
        raise ValueError(f"{name} must lie in {bound}{low}, {high}], got {value!r}")
    return value


@dataclass(frozen=True)
class DatasetRules:
    """A dataset's constants, fixed at creation: every number its beliefs and shared state evolve by.

    alpha0, beta0: the Beta prior (the spec's beta_prior); beta_decay, the Beta update's forgetting factor
    (docs/methods.md §1), and hmm_decay, DPS's (§2); prior_strength s and group_decay gamma (§6); sec_lr (SEC's
    learning rate for Q) and adarft_eta / adarft_alpha / adarft_beta (AdaRFT's update of T), §7. Each keeps
    its setting's name from the stored spec down to the kernels' arguments, and those that are settings
    have the declaration's defaults and domain (rlvr_selector_client.contract, checked by
    domain.settings_problems); SEC's and AdaRFT's are their strategies' dataset-level parameters
    (strategies.dataset_rules resolves them from a spec's defaults).

    A decay left None is not fixed by the dataset: each call that applies it names it (beliefs.apply_results'
    beta_decay, dps.close_step's hmm_decay), which is how the kernels are driven without a spec (tests,
    benchmarks). A dataset built from a spec fixes both, and a call may then name only the same value:
    a constant never reaches a kernel by two ways with two values (`decay`).
    """

    alpha0: float = DEFAULTS["beta_prior"][0]
    beta0: float = DEFAULTS["beta_prior"][1]
    beta_decay: float | None = None
    hmm_decay: float | None = None
    prior_strength: float = DEFAULTS["prior_strength"]
    group_decay: float = DEFAULTS["group_decay"]
    sec_lr: float = 0.5
    adarft_eta: float = 50.0
    adarft_alpha: float = 2.0
    adarft_beta: float = 0.5

    def __post_init__(self) -> None:
        settings = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        problem = settings_problems({**settings, "beta_prior": (self.alpha0, self.beta0)})
        if problem:
            raise ValueError(problem)
        _finite("sec lr", self.sec_lr, 0.0, 1.0)
        _finite("adarft eta", self.adarft_eta, 0.0, 100.0)
        _finite("adarft alpha", self.adarft_alpha, 0.0, 1e3)
        _finite("adarft beta", self.adarft_beta, 0.0, 1.0)

    def decay(self, name: str, given: float | None) -> float:
        """The decay `name` (beta_decay or hmm_decay) a call applies: the dataset's, or `given` where the
        rules leave it open. ValueError when neither names it, when `given` differs from the dataset's, or
        when it lies outside [0, 1] (a kernel's domain: 0 forgets everything at once)."""
        fixed = getattr(self, name)
        if given is None:
            if fixed is None:
                raise ValueError(f"{name} is not fixed by the dataset's rules: name it in the call")
            return float(fixed)
        value = float(given)
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ValueError(f"{name} (forgetting factor) must lie in [0, 1], got {given!r}")
        if fixed is not None and value != fixed:
            raise ValueError(f"{name} {given!r} differs from the dataset's {fixed!r}: leave it out")
        return value


def _zeros(n: int, dtype: Any = np.float64) -> np.ndarray:
    return np.zeros(n, dtype=dtype)


#: name -> dtype of the arrays of SharedState indexed by group (all of length n_groups).
GROUP_FIELDS: dict[str, np.dtype] = {
    "group_successes": np.dtype(np.float64),  # S_g
    "group_trials": np.dtype(np.float64),  # T_g
    "group_size": np.dtype(np.int64),  # prompts whose metadata puts them in g
    "sec_q": np.dtype(np.float64),  # SEC's Q_g
    "sec_pos": np.dtype(np.int64),  # SEC: position of g's walk (passes * size + offset)
    "step_adv": np.dtype(np.float64),  # SEC: sum of the mean |advantage| of g's results at the open step
    "step_adv_n": np.dtype(np.int64),  # ... and their number
}

#: Scalars of SharedState written to snapshots (JSON numbers; Python floats round-trip exactly).
SCALARS = (
    "pass_rate_known",
    "grouped",
    "greso_pos",
    "p_easy",
    "p_hard",
    "adarft_t",
    "pass_samples_known",
    "profile_rollouts",
)


@dataclass(eq=False)
class SharedState:
    """What one dataset keeps beside its per-prompt arrays (a plain container; see the module docstring)."""

    rules: DatasetRules = field(default_factory=DatasetRules)
    group_successes: np.ndarray = field(default_factory=lambda: _zeros(0))
    group_trials: np.ndarray = field(default_factory=lambda: _zeros(0))
    group_size: np.ndarray = field(default_factory=lambda: _zeros(0, np.int64))
    sec_q: np.ndarray = field(default_factory=lambda: _zeros(0))
    sec_pos: np.ndarray = field(default_factory=lambda: _zeros(0, np.int64))
    step_adv: np.ndarray = field(default_factory=lambda: _zeros(0))
    step_adv_n: np.ndarray = field(default_factory=lambda: _zeros(0, np.int64))
    #: results, all-solved, all-failed, successes, trials applied at the open step (STEP_* indices)
    step_counts: np.ndarray = field(default_factory=lambda: _zeros(5))
    pass_rate_known: int = 0  # prompts with a known pass rate
    pass_samples_known: int = 0  # prompts with a sample count behind their pass rate
    profile_rollouts: int = 0  # sum of the sample counts uploaded as profiled (docs/api.md section 2)
    grouped: int = 0  # prompts with a group
    greso_pos: int = 0  # GRESO: global position of its walk over the concatenated epoch permutations
    p_easy: float = 0.5
    p_hard: float = 0.5
    adarft_t: float = 0.0
    #: Bumped whenever a cold prior may have changed (metadata, group sums); never persisted: caches
    #: of this process compare it, a loaded state starts with fresh caches.
    cold_version: int = 0
    #: SEC's member index (walks.sec_members), built on first use; dropped by a metadata upload.
    members_cache: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def n_groups(self) -> int:
        """Length of the per-group arrays: 1 + the largest group id ever uploaded (0 without groups)."""
        return int(self.group_successes.shape[0])

    def group_arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in GROUP_FIELDS}

    def grow(self, n_groups: int) -> None:
        """Extends the per-group arrays to `n_groups` (zeros for the new groups)."""
        old = self.n_groups
        if n_groups <= old:
            return
        for name, dtype in GROUP_FIELDS.items():
            arr = np.zeros(n_groups, dtype=dtype)
            arr[:old] = getattr(self, name)
            setattr(self, name, arr)

    def copy(self) -> SharedState:
        new = replace(self, step_counts=self.step_counts.copy(), members_cache=None)
        for name, arr in self.group_arrays().items():  # set by name: a **dict of them is not typed per field
            setattr(new, name, arr.copy())
        return new

    # ---- snapshots ----------------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        """Scalars for a snapshot header (the rules come from the dataset spec, not from here)."""
        doc = {name: getattr(self, name) for name in SCALARS}
        doc["step_counts"] = [float(x) for x in self.step_counts]
        return doc

    @classmethod
    def from_parts(
        cls, rules: DatasetRules, header: dict[str, Any], arrays: dict[str, np.ndarray]
    ) -> SharedState:
        """Rebuilds the state from `header()` and `group_arrays()`; ValueError when they do not fit."""
        if not arrays:  # no group was ever uploaded: a writer may leave the empty arrays out
            arrays = {name: np.zeros(0, dtype=dtype) for name, dtype in GROUP_FIELDS.items()}
        missing = set(GROUP_FIELDS) - set(arrays)
        unknown = set(arrays) - set(GROUP_FIELDS)
        if missing or unknown:
            raise ValueError(f"shared arrays: missing {sorted(missing)}, unknown {sorted(unknown)}")
        lengths = {np.shape(arr) for arr in arrays.values()}
        if len(lengths) != 1 or len(next(iter(lengths))) != 1 or next(iter(lengths))[0] > MAX_GROUPS:
            raise ValueError(f"shared arrays must be 1-d of one length <= {MAX_GROUPS}, got {lengths}")
        try:
            counts = np.array(header["step_counts"], dtype=np.float64)
            state = cls(
                rules=rules,
                step_counts=counts,
                pass_rate_known=int(header["pass_rate_known"]),
                pass_samples_known=int(header["pass_samples_known"]),
                profile_rollouts=int(header["profile_rollouts"]),
                grouped=int(header["grouped"]),
                greso_pos=int(header["greso_pos"]),
                p_easy=float(header["p_easy"]),
                p_hard=float(header["p_hard"]),
                adarft_t=float(header["adarft_t"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"shared state header is incomplete or malformed: {exc!r}") from exc
        if counts.shape != (5,):
            raise ValueError(f"shared state step_counts must have 5 entries, got {counts.shape}")
        for name, dtype in GROUP_FIELDS.items():  # set by name: a **dict of them is not typed per field
            setattr(
                state, name, np.require(np.asarray(arrays[name]), dtype=dtype, requirements=["C", "W", "A"])
            )
        return state
