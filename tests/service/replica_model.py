"""A reference model of one dataset for the randomized replica tests, fed only acknowledged requests.

The service's promise, stated as what the model checks: every acknowledged observation is applied
exactly once, at the open step it was appended at (its reported step plus the lag it was answered
with), and every step that an acknowledged request opened is closed in order, each close ending where a
request opened a step (a close over a gap walks its steps at once, so where closes ended shows in the
last bits). A select refused after more than one send may have closed its step in an earlier send, which
its client cannot know: the model allows each subset of those steps (`states`). Nothing else may change
the beliefs. With `beta_decay` 1 and whole successes the Beta sums and the pooled step states do not
depend on the order of results within a step, so the model does not need the log's order: it replays
the acknowledged results step by step in a canonical order on a fresh single-process `DatasetState`,
and every replica's beliefs, counts and batches must equal the model's bit for bit. The one exception
is `last_state` (the state of a prompt's latest result, used by history resampling), which depends on
the log's order among the results of a prompt's last step: the model gives the set of states it may
take, and replicas must agree on it with each other. The same holds for `streak` (GRESO's trailing run
of all-solved or all-failed results) and what depends on it (GRESO's batches and walk position).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from selector_service.dataset.state import LAG_LABELS, DatasetSpec, DatasetState
from selector_service.replication.engine import Engine


@dataclass
class Ack:
    """One acknowledged observe: its results and the open step it was applied at."""

    request_id: str
    step: int
    lag: int
    results: list  # SimpleNamespace(prompt_id, rewards, successes, trials)

    @property
    def applied_at(self) -> int:
        return self.step + self.lag


@dataclass
class ReplicaModel:
    spec: DatasetSpec
    acks: dict[str, Ack] = field(default_factory=dict)
    open_step: int = 0
    #: Every step an acknowledged request opened: where the service's closes ended (a close over a gap
    #: is one walk, whose float32 rounding differs from closing its steps one at a time).
    opened_steps: set[int] = field(default_factory=set)
    #: Steps a select may have opened unacknowledged: sent more than once (a replica killed or the store
    #: unreachable mid-call), then refused; whether an earlier send committed its close is unknowable to
    #: the client. The service's closes ended at some subset of them (`states`).
    maybe_steps: set[int] = field(default_factory=set)

    def acknowledged(self, request_id: str, step: int, lag: int, results: list) -> None:
        """Records an answer `applied` or `duplicate` for a request; a duplicate must name the same step."""
        known = self.acks.get(request_id)
        if known is not None:
            assert (known.step, known.lag, known.results) == (step, lag, results), (
                f"request {request_id} (step {step}) was answered as a duplicate of a request with "
                f"another body or lag (step {known.step}, lag {known.lag} vs {lag})"
            )
            return
        self.acks[request_id] = Ack(request_id, step, lag, results)
        self.opened(step + lag)

    def opened(self, step: int) -> None:
        """An acknowledged request (select, or observe for a later step) opened `step`."""
        self.open_step = max(self.open_step, step)
        self.opened_steps.add(step)

    def last_states(self) -> dict[int, set[int]]:
        """prompt id -> the states its `last_state` may hold: those of its results applied at its last
        step (their order in the log decides which one)."""
        latest: dict[int, tuple[int, set[int]]] = {}
        for ack in self.acks.values():
            ids, _, _, states = outcome_arrays(self.spec, ack.results)
            for pid, state in zip(ids.tolist(), states.tolist(), strict=True):
                at, allowed = latest.get(pid, (-1, set()))
                if ack.applied_at > at:
                    latest[pid] = (ack.applied_at, {state})
                elif ack.applied_at == at:
                    allowed.add(state)
        return {pid: allowed for pid, (_, allowed) in latest.items()}

    def maybe_opened(self, step: int) -> None:
        """A select at `step` was refused after more than one send: an earlier send may have closed it."""
        self.maybe_steps.add(step)

    def states(self, limit: int = 6) -> list[DatasetState]:
        """The states the service may hold: closes ending where acknowledged requests opened steps, and at
        each subset of the steps unacknowledged selects may have opened (every subset up to `limit` such
        steps, else none and all of them). The first is the one without them."""
        maybe = sorted(
            step for step in self.maybe_steps if step < self.open_step and step not in self.opened_steps
        )
        if len(maybe) > limit:
            subsets = [(), tuple(maybe)]
        else:
            subsets = [
                tuple(s for i, s in enumerate(maybe) if mask >> i & 1) for mask in range(1 << len(maybe))
            ]
        return [self.state(set(extra)) for extra in subsets]

    def state(self, extra: set[int] | None = None) -> DatasetState:
        st = DatasetState(self.spec)
        at: dict[int, list[Ack]] = {}
        for ack in self.acks.values():
            at.setdefault(ack.applied_at, []).append(ack)
        for step in sorted(self.opened_steps | at.keys() | {self.open_step} | (extra or set())):
            st.close_until(step)  # each close ends where a request opened a step, as the service's did
            for ack in sorted(at.get(step, []), key=lambda a: a.request_id):
                ids, succ, trials, states = outcome_arrays(self.spec, ack.results)
                st.apply_outcomes(ids, succ, trials, states)
                lag = min(ack.lag, LAG_LABELS)
                st.results_by_lag[lag] = st.results_by_lag.get(lag, 0) + len(ids)
        return st


def outcome_arrays(spec: DatasetSpec, results: list):
    """The outcomes the service derives from results (docs/methods.md §0, binary mode), computed here by hand."""
    ids, succ, trials, states = [], [], [], []
    for r in results:
        if r.rewards is not None:
            s = float(sum(1 for x in r.rewards if x >= spec.success_threshold))
            t = float(len(r.rewards))
        else:
            s, t = float(r.successes), float(r.trials)
        ids.append(r.prompt_id)
        succ.append(s)
        trials.append(t)
        states.append(1 if s == 0 else 3 if s == t else 2)
    return (
        np.asarray(ids, dtype=np.int64),
        np.asarray(succ, dtype=np.float64),
        np.asarray(trials, dtype=np.float64),
        np.asarray(states, dtype=np.int8),
    )


def random_results(rng, size: int, k: int) -> list:
    """1-4 results for distinct random prompts, as rewards or as successes/trials."""
    out = []
    for pid in rng.sample(range(size), rng.randint(1, min(4, size))):
        if rng.random() < 0.5:
            out.append(
                SimpleNamespace(
                    prompt_id=pid,
                    rewards=[float(rng.random() < 0.5) for _ in range(k)],
                    successes=None,
                    trials=None,
                )
            )
        else:
            out.append(SimpleNamespace(prompt_id=pid, rewards=None, successes=rng.randint(0, k), trials=k))
    return out


def differences(replica: DatasetState, model: DatasetState, last: dict[int, set[int]] | None = None):
    """What differs between a replica's state and the model's (empty when equal bit for bit). With
    `last` (ReplicaModel.last_states), last_state is checked against the states it may hold instead."""
    diffs = []
    # Canonical forms: the observed set in prompt-id order (replicas append prompts in log order, the
    # model in its own; the beliefs, and every batch, do not depend on that order).
    left, right = replica.arrays.canonical_arrays(), model.arrays.canonical_arrays()
    if last is not None:
        for pid in range(len(right["last_state"])):
            allowed = last.get(pid, {0})
            if int(left["last_state"][pid]) not in allowed:
                diffs.append(f"last_state of prompt {pid} is {left['last_state'][pid]}, not in {allowed}")
    for name in right:
        if last is not None and name in ("last_state", "streak"):
            continue
        if left[name].tobytes() != right[name].tobytes():  # bit for bit (NaN metadata included)
            differ = left[name] != right[name]
            if left[name].dtype.kind == "f":
                differ &= ~(np.isnan(left[name]) & np.isnan(right[name]))
            bad = np.flatnonzero(differ.reshape(len(left[name]), -1).any(axis=1))
            diffs.append(f"{name} differs at prompts {bad[:8].tolist()}")
    shared_left, shared_right = replica.arrays.shared.header(), model.arrays.shared.header()
    if last is not None:
        shared_left.pop("greso_pos")
        shared_right.pop("greso_pos")
    if shared_left != shared_right:
        diffs.append(f"shared state: replica {shared_left}, model {shared_right}")
    for attr in ("open_step", "results", "rollouts", "steps_closed", "results_by_lag"):
        if getattr(replica, attr) != getattr(model, attr):
            diffs.append(f"{attr}: replica {getattr(replica, attr)!r}, model {getattr(model, attr)!r}")
    return diffs


# Selections whose batches depend on the beliefs only; history resampling (on last_state) is compared
# between replicas instead.
SELECTIONS = (
    ("insight", {}, 0),
    ("insight", {"candidate_ratio": None}, 3),
    ("dps", {}, 1),
    ("mopps", {}, 2),
    ("uniform", {}, 5),
    ("expected_difficulty", {"candidate_ratio": None}, 4),
    ("learnability", {}, 6),
    ("adarft", {}, 7),
)
ORDER_DEPENDENT = (("history_resampling", {}, 0), ("greso", {}, 0))


def model_batches(spec: DatasetSpec, st: DatasetState, batch_size: int, selections=SELECTIONS):
    out = []
    for strategy, params, seed in selections:
        merged = Engine.resolve_params(spec, strategy, params)
        ids, _ = st.select(strategy, merged, batch_size, seed)
        out.append(ids.tolist())
    return out
