"""What requests become in the log: requests checked against their dataset, packed into the payloads
of log records (state.pack_results and state.pack_metadata define the record layout), and the digests
that name them (an observe's body, bound to its request id; a select's, in the step history).

Everything here is a pure function of the request and the dataset's spec: no store, no state, so every
replica packs a request into the same bytes and refuses a bad one with the same words.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from selector_service.contract.schemas import PackedResults, RolloutBudget
from selector_service.core import strategies
from selector_service.core.outcomes import outcomes_from_counts, outcomes_from_flat
from selector_service.core.rollouts import RolloutError, RolloutRequest, check_rollouts
from selector_service.dataset.history import select_note
from selector_service.dataset.state import DatasetSpec, pack_results
from selector_service.errors import InvalidRequest


def resolve_params(spec: DatasetSpec, strategy: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters a request for `strategy` runs with: the dataset's defaults for it, then the
    request's own, checked (InvalidRequest naming the parameter and the fix)."""
    if strategy not in strategies.STRATEGIES:
        raise InvalidRequest(
            f"unknown strategy {strategy!r}; choose one of {', '.join(sorted(strategies.STRATEGIES))}"
        )
    try:
        return strategies.resolve_params(strategy, params, spec.defaults)
    except strategies.ParamError as exc:
        raise InvalidRequest(str(exc)) from exc


@dataclass(frozen=True)
class SelectPlan:
    """A select checked against one incarnation of its dataset (`uid`): the step it closes every step
    below, the batch it chooses (strategy, its resolved parameters, seed) and the rollouts it shares out
    over it. `note` names it in the step's history (a request that gives the same batch shares it).

    Built by `plan_select` where the select enters the engine, which runs it without checking the
    request again: what is left to check is the caught-up state (the step's reach, what the strategy
    needs of the beliefs). It holds only for its incarnation: a select retried on a recreated dataset is
    planned again from the new spec."""

    name: str
    uid: str
    step: int
    batch_size: int
    strategy: str
    params: dict[str, Any]
    seed: int
    rollouts: RolloutRequest | None
    note: str
    filter: dict[str, Any] | None = None


def plan_select(
    spec: DatasetSpec,
    *,
    step: int,
    batch_size: int,
    strategy: str,
    params: dict[str, Any],
    seed: int,
    rollouts: RolloutBudget | None,
    filter: dict[str, Any] | None = None,
) -> SelectPlan:
    """The select of the request's fields against `spec`, every check that the spec decides done
    (InvalidRequest naming the fix): the batch size against the dataset's size first (a budget's bounds
    follow from it), then the rollout budget, then the parameters, then the filter's settings."""
    problem = strategies.batch_size_problem(batch_size, spec.size, spec.name)
    if problem is not None:
        raise InvalidRequest(problem)
    request = None
    if rollouts is not None:
        try:
            request = check_rollouts(batch_size, rollouts.budget, rollouts.min, rollouts.max, rollouts.policy)
        except RolloutError as exc:
            raise InvalidRequest(f"{exc}; nothing was applied") from None
    merged = resolve_params(spec, strategy, params)
    settings = None
    if filter is not None:
        try:
            settings = strategies.resolve_filter(strategy, filter)
        except strategies.ParamError as exc:
            raise InvalidRequest(f"filter: {exc}; nothing was applied") from None
    # A filtered select chooses another batch: its digest names the filter (an unfiltered one's is what
    # it was before filters existed).
    named = [strategy, merged, seed, batch_size] + ([settings] if settings is not None else [])
    digest = hashlib.blake2b(
        json.dumps(named, sort_keys=True, default=str).encode(), digest_size=12
    ).hexdigest()
    note = select_note(strategy, batch_size, digest)
    return SelectPlan(spec.name, spec.uid, step, batch_size, strategy, merged, seed, request, note, settings)


def check_ids(ids: np.ndarray, size: int) -> None:
    """InvalidRequest unless `ids` is a non-empty array of prompt ids in 0..size-1."""
    if ids.size == 0:
        raise InvalidRequest("prompt_ids is empty: pass at least one prompt id")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= size:
        bad = lo if lo < 0 else hi
        raise InvalidRequest(f"prompt id {bad} is out of range: ids must be in 0..{size - 1}")


def outcome_payload(spec: DatasetSpec, step: int, results: Sequence[Any]) -> tuple[bytes, str]:
    """Turns results into packed (ids, successes, trials, states), checking values against the spec, and
    the digest of the request body (dataset, step and results exactly as sent: rewards, or successes
    and trials) that a request id is bound to.

    `results` are the fast twin's PackedResults (schemas.decode_observe), or objects with the attributes
    `prompt_id`, `rewards`, `successes`, `trials` (the contract's validated models), packed the same way
    first: every body is checked by the one set of array checks below, so both parsers' bodies are
    refused in the same words.
    """
    pr = results if isinstance(results, PackedResults) else PackedResults.of(results)
    n = len(pr)
    if n == 0:
        raise InvalidRequest("results is empty: send at least one result")
    ids, has_r, s, t = pr.ids, pr.has_rewards, pr.successes, pr.trials
    lengths = np.diff(pr.offsets)
    has_s, has_t = ~np.isnan(s), ~np.isnan(t)
    counts = ~has_r
    # The checks, in the order a row's problems are named: the first row with a problem is refused, with
    # the first problem of that row.
    with np.errstate(invalid="ignore"):
        s_, t_ = np.nan_to_num(s), np.nan_to_num(t, nan=1.0)
        checks = (
            (~((ids >= 0) & (ids < spec.size)),
             lambda i: f"results[{i}].prompt_id {ids[i]} is out of range: ids must be in 0..{spec.size - 1}"),
            (has_r & (has_s | has_t),
             lambda i: f"results[{i}]: send either rewards or successes + trials, not both"),
            (has_r & (lengths == 0), lambda i: f"results[{i}].rewards is empty: send one reward per rollout"),
            (counts & ~(has_s & has_t), lambda i: f"results[{i}]: send rewards, or both successes and trials"),
            (counts & ((t_ < 1) | (t_ != np.floor(t_))),
             lambda i: f"results[{i}].trials is {int(t[i])}: it must be a whole number >= 1"),
            (counts & (s_ < 0), lambda i: f"results[{i}].successes is {s[i]}: it must be >= 0"),
            (counts & (s_ > t_), lambda i: f"results[{i}]: successes ({s[i]}) > trials ({int(t[i])})"),
            (counts & (s_ != np.floor(s_)) & (spec.reward_mode == "binary"),
             lambda i: f"results[{i}].successes is {s[i]}: a binary-mode dataset counts whole successes "
             "(create the dataset with reward_mode 'fractional' for fractional rewards)"),
        )  # fmt: skip
    bad = [(int(np.argmax(mask)), order) for order, (mask, _) in enumerate(checks) if mask.any()]
    if bad:
        row, order = min(bad)
        raise InvalidRequest(checks[order][1](row))
    values = pr.values
    reward_rows = np.flatnonzero(has_r)
    count_rows = np.flatnonzero(counts)
    offsets = np.zeros(reward_rows.size + 1, dtype=np.int64)
    np.cumsum(lengths[reward_rows], out=offsets[1:])
    if not np.isfinite(values).all():
        bad_value = int(np.flatnonzero(~np.isfinite(values))[0])
        row = int(reward_rows[int(np.searchsorted(offsets, bad_value, side="right")) - 1])
        raise InvalidRequest(
            f"results[{row}].rewards contains {values[bad_value]}: rewards must be finite numbers"
        )
    succ = np.empty(n, dtype=np.float64)
    trials = np.empty(n, dtype=np.float64)
    states = np.empty(n, dtype=np.int8)
    if reward_rows.size:
        rs, rt, rst = outcomes_from_flat(values, offsets, spec.reward_mode, spec.success_threshold)
        succ[reward_rows], trials[reward_rows], states[reward_rows] = rs, rt, rst
    if count_rows.size:
        succ[count_rows], trials[count_rows] = s[count_rows], t[count_rows]
        states[count_rows] = outcomes_from_counts(succ[count_rows], trials[count_rows])
    return pack_results(ids, succ, trials, states), _body_digest(
        spec.name, step, ids, values, offsets, reward_rows, succ, trials, count_rows
    )


def with_evidence_step(digest: str, selected_step: int | None) -> str:
    """The digest of an observe body that also names its `selected_step` (none: the body's own digest,
    which a body without the field has)."""
    if selected_step is None:
        return digest
    h = hashlib.blake2b(digest_size=16)
    h.update(digest.encode())
    h.update(b" selected_step ")
    h.update(int(selected_step).to_bytes(8, "little"))
    return h.hexdigest()


def _body_digest(
    name: str,
    step: int,
    ids: np.ndarray,
    values: np.ndarray,
    offsets: np.ndarray,
    reward_rows: np.ndarray,
    succ: np.ndarray,
    trials: np.ndarray,
    count_rows: np.ndarray,
) -> str:
    """blake2b of an observe body in a canonical binary form: each part length-prefixed, numbers as
    little-endian int64/float64 (so 1 and 1.0 are the same reward, as they are the same number in JSON)."""
    h = hashlib.blake2b(digest_size=16)

    def part(data: bytes) -> None:
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    part(name.encode())
    part(int(step).to_bytes(8, "little"))
    for arr, dtype in (
        (ids, "<i8"),
        (reward_rows, "<i8"),
        (offsets, "<i8"),
        (values, "<f8"),
        (count_rows, "<i8"),
        (succ[count_rows] if len(count_rows) else (), "<f8"),
        (trials[count_rows] if len(count_rows) else (), "<f8"),
    ):
        part(np.ascontiguousarray(arr, dtype=dtype).tobytes())
    return h.hexdigest()
