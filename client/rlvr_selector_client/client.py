"""Typed HTTP client for the selector service's REST contract (docs/api.md), sync and async.

Every trainer-side component talks to the service through this module only.

Exception tree (each carries ``status`` (int | None), the server's ``detail``, and the ``method``,
``path`` and ``attempts`` of the call when the failure came from one):

    SelectorError                 base: any failed call
    ├── ServiceUnavailable        not answered: cannot connect, timed out, the call's deadline passed,
    │   │                              or 502/503/504 after all retries; for a write (observe, select,
    │   │                              create, metadata upload, delete) it means that no attempt reached
    │   │                              the service: nothing was applied
    │   └── OutcomeUnknown        a write that may have been applied: an attempt was sent and its
    │                                  answer lost (connection reset, timeout, 502/503/504, deadline),
    │                                  and no later attempt got an answer
    ├── AuthError                 401 (token missing) / 403 (token wrong)
    ├── NotFound                  404 (unknown dataset)
    ├── Conflict                  409 (name taken with another spec; step closed beyond max_lag;
    │                                  request id already used with another body or dataset)
    ├── ContractMismatch          the service speaks another contract version (its message says which
    │                                  package to upgrade)
    └── InvalidRequest            400 / 413 / 422 (malformed or out-of-range input; nothing applied)

What a trainer does with each (docs/operations.md, "Errors and what to do"):

- ``OutcomeUnknown``: send the *same* call again (an observe with the same ``request_id`` and
  results) until it is acknowledged; never under a new request id (it would count twice) and never
  count it as lost. The service applies a request id at most once, and this client then answers with
  what the first application applied. `rlvr_selector_client.integrations.observe_exactly_once` (and
  its async twin) is that loop; every adapter reports through it.
- ``ServiceUnavailable``: nothing was applied; wait for the service (``check_server``) and send again.
- The others are not transient: repeating the call cannot help; their message says what to change.

Retries: connect errors, timeouts, dropped connections and 502/503/504 are retried ``retries`` times
with exponential backoff (``backoff * 2**attempt`` seconds, capped at 8 s) or after the server's
``Retry-After``, all within the call's deadline. Every endpoint is safe to retry: creating a dataset
with the same spec answers 200, a select for the same step and seed returns the same batch, a score
writes nothing, and an observe carries a caller-chosen ``request_id`` that the service applies at most
once. An observe also carries a ``Selector-Call`` header (docs/api.md section 4), an id this client
draws for the call and sends with each of its attempts: a retry whose first attempt was applied (its
answer lost on the wire) is answered with what that attempt applied, ``applied: n, duplicate: false``,
so summing ``applied`` over the calls counts every result once; ``duplicate: true`` answers only a
request the caller sent again after it was acknowledged. After an ``OutcomeUnknown`` the client keeps
the call's id for its request id (the last `PENDING_CALLS` of them), so observing the same request id
again on the same client continues that call. Other 4xx/5xx answers are not retried.

Deadline: every call ends within ``deadline`` seconds (default `default_deadline`: ``timeout`` for
each attempt plus the backoff schedule, 43.5 s with the defaults), connecting, sending, every read of
the answer, retries and their waits included: an answer that trickles in byte by byte ends at the
deadline like a silent one, with ``ServiceUnavailable`` or, for a write that was sent, ``OutcomeUnknown``.
A ``Retry-After`` is waited when the deadline leaves time for it, else the call ends at once.

Error messages name the call (method and path; the service URL when no answer came), the attempts
made, the cause (exception type and text) and for an HTTP error its status and the first line of its
body.
"""

from __future__ import annotations

import array
import math
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from rlvr_selector_client import contract

__all__ = [
    "AsyncSelectorClient",
    "AuthError",
    "Belief",
    "Beliefs",
    "Conflict",
    "ContractMismatch",
    "DatasetInfo",
    "InvalidRequest",
    "MetadataAck",
    "NotFound",
    "ObserveAck",
    "OutcomeUnknown",
    "Result",
    "RolloutBudget",
    "Scores",
    "Selection",
    "SelectorClient",
    "SelectorError",
    "ServiceUnavailable",
]

_RETRY_STATUSES = frozenset({502, 503, 504})
#: The defaults of create_dataset's settings (contract.py).
_DEFAULT = contract.DEFAULTS
_MAX_BACKOFF_S = 8.0
#: Characters of a non-JSON error body a message quotes (its first line).
_BODY_CHARS = 200
#: Request ids whose last observe ended in OutcomeUnknown that a client remembers the call id of.
PENDING_CALLS = 4096


def default_deadline(timeout: float, retries: int, backoff: float) -> float:
    """The deadline of a call when none is given: ``timeout`` for each of its ``retries + 1``
    attempts plus the waits between them (43.5 s for the defaults: 10 s, 3 retries, 0.5 s)."""
    waits = sum(min(backoff * 2**attempt, _MAX_BACKOFF_S) for attempt in range(retries))
    return timeout * (retries + 1) + waits


# ---------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------
class SelectorError(Exception):
    """A call to the selector service failed; ``str(err)`` says what happened and what to do.

    ``method``, ``path``: the call's request; ``attempts``: how many times it was sent (None when the
    error did not come from one request, e.g. a beliefs read that kept meeting a moving step)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        detail: str | None = None,
        method: str | None = None,
        path: str | None = None,
        attempts: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail if detail is not None else message
        self.method = method
        self.path = path
        self.attempts = attempts


class ServiceUnavailable(SelectorError):
    """The service did not answer: it could not be reached, timed out, the call's deadline passed, or
    it kept answering 502/503/504. Raised as such for a write only when no attempt reached the service
    (nothing was applied); a write that may have been applied raises `OutcomeUnknown`."""


class OutcomeUnknown(ServiceUnavailable):
    """A write that may have been applied: one of its attempts was sent and its answer never came
    (connection reset or closed, timeout, 502/503/504, the deadline), and no later attempt answered.

    Send the same call again (an observe: the same ``request_id`` and results) until it is
    acknowledged. The service applies it at most once; on the same client the answer then counts what
    the first application applied. Never send the results under a new request id (they would count
    twice) and do not count them as lost. ``request_id``: the observe's (None for other writes)."""

    def __init__(self, message: str, *, request_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.request_id = request_id


class AuthError(SelectorError):
    """The service rejected the bearer token (401 missing, 403 wrong)."""


class NotFound(SelectorError):
    """The named dataset does not exist."""


class Conflict(SelectorError):
    """The request conflicts with the service's state (dataset spec differs; step already closed)."""


class ContractMismatch(SelectorError):
    """The service speaks another version of the contract (contract.CONTRACT) than this client."""


class InvalidRequest(SelectorError):
    """The service rejected the request's content (400/413/422); nothing was applied."""


_STATUS_ERRORS: dict[int, type[SelectorError]] = {
    400: InvalidRequest,
    401: AuthError,
    403: AuthError,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    422: InvalidRequest,
    502: ServiceUnavailable,
    503: ServiceUnavailable,
    504: ServiceUnavailable,
}

#: What an exception of these types says when its own text is empty (httpx's async timeouts are).
_SILENT_CAUSES: tuple[tuple[type[BaseException], str], ...] = (
    (httpx.ConnectTimeout, "no connection within the timeout"),
    (httpx.ReadTimeout, "no answer within the timeout"),
    (httpx.WriteTimeout, "the request could not be sent within the timeout"),
    (httpx.PoolTimeout, "no free connection within the timeout"),
    (httpx.ConnectError, "the connection failed"),
    (httpx.RemoteProtocolError, "the server closed the connection without a complete answer"),
    (httpx.ReadError, "the connection failed while reading the answer"),
    (httpx.WriteError, "the connection failed while sending the request"),
    (TimeoutError, "the call's deadline passed"),
)


def _cause(exc: BaseException) -> str:
    """``Type: text`` of an exception, never empty: an empty text is taken from the exception it was
    raised from, else said in words."""
    text = str(exc).strip()
    inner: BaseException | None = exc
    while not text and inner is not None:
        inner = inner.__cause__ or inner.__context__
        text = str(inner).strip() if inner is not None else ""
    if not text:
        text = next((words for kind, words in _SILENT_CAUSES if isinstance(exc, kind)), "no detail given")
    return f"{type(exc).__name__}: {_first_line(text)}"


def _first_line(text: str) -> str:
    """The first non-blank line of ``text``, cut to `_BODY_CHARS` characters."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= _BODY_CHARS else line[: _BODY_CHARS - 3] + "..."


def _short_body(response: httpx.Response) -> str:
    """A non-JSON body in one short line: an HTML page's title (else its first line of text), any other
    body's first line; the reason phrase when it says nothing."""
    text = response.text
    if re.search(r"<(!doctype|html|body|head)\b", text[:1000], re.IGNORECASE):
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        if title and title.group(1).strip():
            text = " ".join(title.group(1).split())
        else:
            text = re.sub(r"<(script|style)\b.*?</\1\s*>", " ", text, flags=re.IGNORECASE | re.DOTALL)
            text = re.sub(r"<[^>]*>", "\n", text)
    return _first_line(text) or response.reason_phrase or f"HTTP {response.status_code}"


def _detail_text(response: httpx.Response) -> str:
    """The server's ``detail`` as one readable string (FastAPI validation lists are flattened); a body
    that is not JSON (a proxy's error page) as its first line."""
    try:
        body = response.json()
    except ValueError:
        return _short_body(response)
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):  # FastAPI/pydantic validation errors
        parts = []
        for item in detail:
            if isinstance(item, dict):
                where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
                parts.append(f"{where}: {item.get('msg', item)}" if where else str(item.get("msg", item)))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)


def _attempts(count: int) -> str:
    return f"{count} attempt" + ("s" if count != 1 else "")


def _error_for(
    method: str, path: str, response: httpx.Response, *, token_sent: bool, attempts: int = 1
) -> SelectorError:
    status = response.status_code
    detail = _detail_text(response)
    cls = _STATUS_ERRORS.get(status, SelectorError)
    message = f"{method} {path} -> HTTP {status} ({_attempts(attempts)}): {detail}"
    if cls is AuthError and status == 401 and not token_sent:
        message += (
            " (the service requires a token and none was sent: pass --token or set SELECTOR_API_TOKEN"
            " to the service's token)"
        )
    elif cls is AuthError:
        message += (
            " (the service requires `Authorization: Bearer <token>`: pass --token or set SELECTOR_API_TOKEN"
            " to the service's token)"
        )
    return cls(message, status=status, detail=detail, method=method, path=path, attempts=attempts)


# ---------------------------------------------------------------------------------------------------
# Request and response types
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Result:
    """One prompt's rollout outcome for ``observe``: raw ``rewards`` or ``successes`` out of ``trials``."""

    prompt_id: int
    rewards: Sequence[float] | None = None
    successes: float | None = None
    trials: float | None = None

    def __post_init__(self) -> None:
        has_rewards = self.rewards is not None
        has_counts = self.successes is not None or self.trials is not None
        if has_rewards == has_counts:
            raise ValueError(
                f"Result for prompt {self.prompt_id}: give either rewards=[...] or successes= and trials=, "
                "exactly one of the two forms"
            )
        if has_counts and (self.successes is None or self.trials is None):
            raise ValueError(f"Result for prompt {self.prompt_id}: successes and trials go together")
        if has_rewards and not all(math.isfinite(float(r)) for r in self.rewards):
            raise ValueError(f"Result for prompt {self.prompt_id}: rewards must be finite numbers")

    def to_json(self) -> dict[str, Any]:
        if self.rewards is not None:
            return {"prompt_id": int(self.prompt_id), "rewards": [float(r) for r in self.rewards]}
        return {"prompt_id": int(self.prompt_id), "successes": self.successes, "trials": self.trials}


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset's spec and (when the service reports it) its running summary.

    The spec's fields are contract.py's settings, in its order, required as in the info body but for
    those of contract.INFO_DEFAULTED (their defaults are the settings'); they are written out for type
    checkers (tests/trainer/test_client.py holds them to the settings)."""

    name: str
    size: int
    rollouts_per_prompt: int
    success_threshold: float
    beta_prior: tuple[float, float]
    beta_decay: float
    hmm_decay: float
    reward_mode: str
    defaults: dict[str, Any]
    max_lag: int = _DEFAULT["max_lag"]
    prior_strength: float = _DEFAULT["prior_strength"]
    group_decay: float = _DEFAULT["group_decay"]
    open_step: int | None = None
    observations: int | None = None
    rollouts: int | None = None
    prompts_observed: int | None = None
    #: Metadata coverage (docs/methods.md §6): prompts with a pass rate, with a group, and distinct groups.
    prompts_with_pass_rate: int | None = None
    prompts_with_group: int | None = None
    groups: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> DatasetInfo:
        spec = body.get("spec") or body
        summary = body.get("summary") or {}

        def _opt_int(key: str) -> int | None:
            value = summary.get(key)
            return int(value) if value is not None else None

        return cls(
            **contract.from_doc(spec),
            open_step=_opt_int("open_step"),
            observations=_opt_int("observations"),
            rollouts=_opt_int("rollouts"),
            prompts_observed=_opt_int("prompts_observed"),
            prompts_with_pass_rate=_opt_int("prompts_with_pass_rate"),
            prompts_with_group=_opt_int("prompts_with_group"),
            groups=_opt_int("groups"),
            raw=dict(body),
        )


def first_step(info: DatasetInfo, start_step: int | None = None) -> int:
    """The step a run starts at: ``start_step`` when given; the open step of a dataset nobody has
    reported to yet; else the step after it (that step may hold another run's results, and continuing
    it would mix two runs' request ids and batches)."""
    if start_step is not None:
        return start_step
    if not info.observations:
        return info.open_step or 0
    return (info.open_step or 0) + 1


@dataclass(frozen=True)
class RolloutBudget:
    """How many rollouts a select asks the service to share out over its prompts (docs/api.md, "Select
    with a rollout budget"): ``budget`` in all, each prompt between ``min`` and ``max`` (``max`` None: the
    service's K limit), allocated by ``policy`` (uniform | knapsack | variance | posterior)."""

    budget: int
    min: int = 1
    max: int | None = None
    policy: str = contract.DEFAULT_ROLLOUT_POLICY

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"budget": int(self.budget), "min": int(self.min), "policy": self.policy}
        if self.max is not None:
            body["max"] = int(self.max)
        return body


@dataclass(frozen=True)
class Selection:
    """The answer of ``/select``: the prompts to train on at ``step`` (and their scores if asked).

    ``rollouts``: with a rollout budget, how many rollouts each prompt of ``prompt_ids`` gets (same
    order); None without one."""

    dataset: str
    step: int
    strategy: str
    prompt_ids: list[int]
    scores: list[float] | None
    rollouts: list[int] | None = None


@dataclass(frozen=True)
class ObserveAck:
    """``applied``: results recorded by this call, also when a retry inside it found its first attempt
    applied (and by a call that continues one that ended in `OutcomeUnknown`); ``duplicate``: an earlier
    call applied the request id (nothing applied now); ``lag``: how many steps late the
    results were applied (0 on time; > 0 only with ``max_lag``). Summed over the calls a trainer made
    once, ``applied`` counts every result it sent."""

    applied: int
    duplicate: bool
    lag: int = 0


@dataclass(frozen=True)
class MetadataAck:
    """The answer of a metadata upload: the prompts it set, the dataset's coverage afterwards and its
    profiling rollouts (the sample counts uploaded with ``profile=True``)."""

    offset: int
    count: int
    prompts_with_pass_rate: int
    prompts_with_group: int
    groups: int
    prompts_with_pass_samples: int = 0
    profile_rollouts: int = 0


@dataclass(frozen=True)
class Belief:
    prompt_id: int
    alpha: float
    beta: float
    mean: float
    observations: int
    hmm_prior: tuple[float, float, float]
    group: int = -1
    prior_pass_rate: float | None = None


@dataclass(frozen=True)
class Beliefs:
    open_step: int
    beliefs: list[Belief]


@dataclass(frozen=True)
class Scores:
    open_step: int
    scores: list[float]


T = TypeVar("T")


@dataclass(frozen=True)
class _Call(Generic[T]):
    """One HTTP exchange: what to send and how to turn the JSON answer into a typed value.

    ``resend``: for a write, what to do when its outcome is unknown (the advice of `OutcomeUnknown`);
    None for a call that writes nothing."""

    method: str
    path: str
    parse: Any  # Callable[[httpx.Response], T]
    json: Any = None
    params: dict[str, str] | None = None
    content: bytes | None = None  # a raw body (sent as application/octet-stream)
    headers: dict[str, str] | None = None
    resend: str | None = None
    request_id: str | None = None

    def send_kwargs(self) -> dict[str, Any]:
        headers = dict(self.headers or {})
        if self.content is None:
            return {"json": self.json, "params": self.params, "headers": headers}
        headers["Content-Type"] = "application/octet-stream"
        return {"content": self.content, "params": self.params, "headers": headers}


_RESEND_CREATE = "Send the same create again: the same spec answers with the dataset as it is."
_RESEND_SELECT = (
    "Send the same select again (the same step, batch size, strategy, params and seed): it answers "
    "the same batch and closes no further step."
)
_RESEND_METADATA = "Send the same upload again: the same values set the same priors."
_RESEND_DELETE = "Send the delete again: a dataset that is gone already answers as deleted."


def _resend_observe(request_id: str) -> str:
    return (
        f"Send the same observe again with request_id {request_id!r} and the same results until it is "
        "acknowledged: the service applies a request id at most once, and on this client the answer "
        "counts what the first application applied. Never send these results under a new request id "
        "(they would count twice) and do not count them as lost; a trainer loop waits for the service "
        "and resends (rlvr_selector_client.integrations.observe_exactly_once does this)."
    )


def _json(response: httpx.Response) -> Any:
    return response.json()


def _parse_selection(response: httpx.Response) -> Selection:
    body = response.json()
    scores = body.get("scores")
    rollouts = body.get("rollouts")
    return Selection(
        dataset=str(body["dataset"]),
        step=int(body["step"]),
        strategy=str(body["strategy"]),
        prompt_ids=[int(i) for i in body["prompt_ids"]],
        scores=[float(s) for s in scores] if scores is not None else None,
        rollouts=[int(n) for n in rollouts] if rollouts is not None else None,
    )


def _parse_ack(response: httpx.Response) -> ObserveAck:
    body = response.json()
    return ObserveAck(
        applied=int(body["applied"]), duplicate=bool(body["duplicate"]), lag=int(body.get("lag", 0))
    )


def _parse_beliefs(response: httpx.Response) -> Beliefs:
    body = response.json()
    beliefs = [
        Belief(
            prompt_id=int(b["prompt_id"]),
            alpha=float(b["alpha"]),
            beta=float(b["beta"]),
            mean=float(b["mean"]),
            observations=int(b["observations"]),
            hmm_prior=tuple(float(x) for x in b["hmm_prior"]),  # type: ignore[arg-type]
            group=int(b.get("group", -1)),
            prior_pass_rate=None if b.get("prior_pass_rate") is None else float(b["prior_pass_rate"]),
        )
        for b in body["beliefs"]
    ]
    return Beliefs(open_step=int(body["open_step"]), beliefs=beliefs)


def _parse_scores(response: httpx.Response) -> Scores:
    body = response.json()
    return Scores(open_step=int(body["open_step"]), scores=[float(s) for s in body["scores"]])


def _parse_metadata_ack(response: httpx.Response) -> MetadataAck:
    body = response.json()
    coverage = body["coverage"]
    return MetadataAck(
        offset=int(body["offset"]),
        count=int(body["count"]),
        prompts_with_pass_rate=int(coverage["prompts_with_pass_rate"]),
        prompts_with_group=int(coverage["prompts_with_group"]),
        groups=int(coverage["groups"]),
        prompts_with_pass_samples=int(coverage.get("prompts_with_pass_samples", 0)),
        profile_rollouts=int(body.get("profile_rollouts", 0)),
    )


def _parse_dataset(response: httpx.Response) -> DatasetInfo:
    return DatasetInfo.from_json(response.json())


def _parse_dataset_names(response: httpx.Response) -> list[str]:
    body = response.json()
    items = body.get("datasets", []) if isinstance(body, dict) else body
    return [str(item["name"]) if isinstance(item, dict) else str(item) for item in items]


def _parse_strategies(response: httpx.Response) -> dict[str, dict[str, Any]]:
    """GET /strategies as {strategy: {parameter: default}}."""
    return {
        str(item["name"]): {str(p["name"]): p.get("default") for p in item.get("params", [])}
        for item in response.json()["strategies"]
    }


def _dataset_path(name: str) -> str:
    return f"/datasets/{quote(name, safe='')}"


def _delete_call(name: str) -> _Call[None]:
    return _Call("DELETE", _dataset_path(name), lambda r: None, resend=_RESEND_DELETE)


def _create_dataset_call(arguments: Mapping[str, Any]) -> _Call[DatasetInfo]:
    """POST /datasets with create_dataset's arguments (by name; None = the service's default)."""
    return _Call(
        "POST", "/datasets", _parse_dataset, json=contract.create_body(arguments), resend=_RESEND_CREATE
    )


def _select_call(
    dataset: str,
    step: int,
    batch_size: int,
    strategy: str,
    params: Mapping[str, Any] | None,
    seed: int,
    return_scores: bool,
    rollouts: RolloutBudget | None = None,
    filter: Mapping[str, Any] | None = None,
) -> _Call[Selection]:
    body: dict[str, Any] = {
        "dataset": dataset,
        "step": int(step),
        "batch_size": int(batch_size),
        "strategy": strategy,
        "seed": int(seed),
        "return_scores": bool(return_scores),
    }
    if params:
        body["params"] = dict(params)
    if rollouts is not None:
        body["rollouts"] = rollouts.to_json()
    if filter is not None:  # docs/api.md section 3, "Select with a filter"
        body["filter"] = dict(filter)
    return _Call("POST", "/select", _parse_selection, json=body, resend=_RESEND_SELECT)


def _observe_call(
    dataset: str, step: int, results: Iterable[Result], request_id: str, selected_step: int | None = None
) -> _Call[ObserveAck]:
    if not request_id or len(request_id) > 128:
        raise ValueError(f"request_id must be 1..128 characters, got {len(request_id or '')}")
    payload = [r.to_json() for r in results]
    if not payload:
        raise ValueError("observe needs at least one Result")
    body: dict[str, Any] = {
        "dataset": dataset,
        "step": int(step),
        "request_id": request_id,
        "results": payload,
    }
    if selected_step is not None:  # docs/api.md section 4: filed at the open step however late it comes
        body["selected_step"] = int(selected_step)
    return _Call(
        "POST", "/observe", _parse_ack, json=body, resend=_resend_observe(request_id), request_id=request_id
    )


#: Prompts per JSON metadata request; larger uploads go in several requests (or raw, see below).
METADATA_JSON_CHUNK = 100_000
#: Prompts per raw metadata request (4 bytes each: 4 MB, well under the service's 16 MB body limit).
METADATA_RAW_CHUNK = 1_000_000
#: The most samples one pass rate may stand for (docs/api.md ``pass_samples``), and groups 0..MAX_GROUPS-1.
PASS_SAMPLES_MAX, MAX_GROUPS = contract.PASS_SAMPLES_MAX, contract.MAX_GROUPS


def _raw(values: Sequence[float] | Sequence[int] | array.array[Any], code: str) -> bytes:
    """Little-endian float32 ('f') or int32 ('i') bytes of `values`."""
    packed = array.array(code, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (messages show 1.5, not np.float64(1.5))."""
    item = getattr(value, "item", None)
    return item() if callable(item) and getattr(value, "shape", None) == () else value


def _rates(values: Sequence[float | None], at: int) -> list[float]:
    """Pass rates as floats (None/NaN = unknown as NaN); ValueError naming the first bad one (its index
    in the whole upload: `at` is the first value's)."""
    out = [math.nan if r is None else float(r) for r in values]
    for i, r in enumerate(out):
        if not (math.isnan(r) or 0.0 <= r <= 1.0):
            raise ValueError(f"pass_rate[{at + i}] = {r}: pass rates lie in [0, 1] (None/NaN = unknown)")
    return out


def _groups(values: Sequence[int], at: int) -> list[int]:
    out = []
    for i, g in enumerate(values):
        if isinstance(g, bool) or int(g) != g or not -1 <= int(g) < MAX_GROUPS:
            raise ValueError(
                f"group[{at + i}] = {_plain(g)!r}: groups are integers 0..{MAX_GROUPS - 1} (-1 = none)"
            )
        out.append(int(g))
    return out


def _samples(values: Sequence[int | None], at: int) -> list[int]:
    """Sample counts as ints (None = unknown as -1); ValueError naming the first bad one."""
    out = []
    for i, n in enumerate(values):
        if n is None or (isinstance(n, float) and math.isnan(n)):
            out.append(-1)
            continue
        if isinstance(n, bool) or int(n) != n or not 1 <= int(n) <= PASS_SAMPLES_MAX:
            raise ValueError(
                f"pass_samples[{at + i}] = {_plain(n)!r}: a sample count is a whole number in 1..{PASS_SAMPLES_MAX} "
                "(None = unknown)"
            )
        out.append(int(n))
    return out


#: name -> (checker, raw type code) of the arrays of a metadata upload, in the order they are sent.
_METADATA_ARRAYS = {"pass_rate": (_rates, "f"), "group": (_groups, "i"), "pass_samples": (_samples, "i")}
#: name -> (lowest, highest) of the whole numbers of an array (-1: none / unknown; 0 refused for counts).
_INTEGER_RANGES = {"group": (-1, MAX_GROUPS - 1), "pass_samples": (-1, PASS_SAMPLES_MAX)}


#: Buffer formats of numbers an array.array reads as they are (a numpy array's, for one).
_BUFFER_FLOATS, _BUFFER_INTEGERS = frozenset("fd"), frozenset("bBhHiIlLqQ")


def _from_buffer(values: Any, floats: bool) -> array.array[Any] | None:
    """A copy of a 1-d contiguous buffer of numbers (a numpy array) as an array.array, at memcpy speed;
    None when `values` exports none of the kind asked for."""
    try:
        view = memoryview(values)
    except TypeError:
        return None
    if (
        view.ndim != 1
        or not view.c_contiguous
        or view.format not in (_BUFFER_FLOATS if floats else _BUFFER_INTEGERS)
    ):
        return None
    out = array.array(view.format)
    if out.itemsize != view.itemsize:
        return None
    out.frombytes(view.cast("B"))
    return out


def _packed(name: str, values: Sequence[Any]) -> array.array[Any] | None:
    """`values` packed as numbers and checked without a Python object per value where it can be (a
    buffer, or a list of plain numbers), or None when they need the element-by-element path (None
    entries, bools, anything out of range: its message names the first bad one)."""
    floats = name == "pass_rate"
    packed = _from_buffer(values, floats)
    if packed is None:
        if isinstance(values, list | tuple) and any(type(x) is bool for x in values):
            return None
        try:
            packed = array.array("d" if floats else "q", values)
        except (TypeError, ValueError, OverflowError):
            return None
    if not packed:
        return packed
    if floats:
        return None if any(not 0.0 <= x <= 1.0 for x in packed if x == x) else packed
    lo, hi = _INTEGER_RANGES[name]
    if min(packed) < lo or max(packed) > hi or (name == "pass_samples" and 0 in packed):
        return None
    return packed


def _raw_body(name: str, values: Sequence[Any], at: int, checked: bool) -> bytes:
    """The little-endian raw body of one chunk (float32 pass rates, int32 otherwise); `checked`: its
    values passed `_packed` before (only packed again, not checked)."""
    check, code = _METADATA_ARRAYS[name]
    if checked:
        packed = _from_buffer(values, name == "pass_rate")
        if packed is not None and packed.typecode == code and sys.byteorder == "little":
            return packed.tobytes()
        return _raw(packed if packed is not None else values, code)
    return _raw(check(values, at), code)


def _metadata_calls(
    dataset: str,
    pass_rate: Sequence[float | None] | None,
    group: Sequence[int] | None,
    offset: int,
    raw: bool | None,
    pass_samples: Sequence[int | None] | None = None,
    profile: bool = False,
) -> Iterator[_Call[MetadataAck]]:
    """The requests of one metadata upload (docs/api.md `PUT /datasets/{name}/metadata`), in order. Every
    value is checked before this returns (ValueError naming the first bad one, nothing sent); the requests
    are then built one at a time as they are sent, so an upload of any size holds one request's body."""
    given = {
        name: values
        for name, values in (("pass_rate", pass_rate), ("group", group), ("pass_samples", pass_samples))
        if values is not None
    }
    if not given:
        raise ValueError("upload_metadata needs pass_rate, group, pass_samples, or several of them")
    if not isinstance(profile, bool):
        raise ValueError(f"profile must be True or False, got {profile!r}")
    if profile and pass_samples is None:
        raise ValueError("profile=True counts the samples behind the rates: give them as pass_samples")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
    lengths = {name: len(values) for name, values in given.items()}
    n = next(iter(lengths.values()))
    if len(set(lengths.values())) != 1:
        sizes = " and ".join(f"{name} {size}" for name, size in lengths.items())
        raise ValueError(f"the arrays differ in length ({sizes}): give one per prompt in each")
    if n == 0:
        raise ValueError("upload_metadata got empty arrays")
    if raw is None:
        raw = n > METADATA_JSON_CHUNK
    chunk = METADATA_RAW_CHUNK if raw else METADATA_JSON_CHUNK
    fast: set[tuple[str, int]] = set()  # the chunks whose values `_packed` checked
    for name, values in given.items():  # check everything first: a bad value sends nothing
        check = _METADATA_ARRAYS[name][0]
        for lo in range(0, n, chunk):
            part = values[lo : lo + chunk]
            if _packed(name, part) is None:
                check(part, lo)
            else:
                fast.add((name, lo))
    return _metadata_requests(dataset, given, offset, n, chunk, raw, profile, fast)


def _metadata_requests(
    dataset: str,
    given: dict[str, Sequence[Any]],
    offset: int,
    n: int,
    chunk: int,
    raw: bool,
    profile: bool,
    fast: set[tuple[str, int]],
) -> Iterator[_Call[MetadataAck]]:
    path = f"{_dataset_path(dataset)}/metadata"
    if raw:
        for name, values in given.items():
            for lo in range(0, n, chunk):
                body = _raw_body(name, values[lo : lo + chunk], lo, (name, lo) in fast)
                params = {"offset": str(offset + lo)}
                if name == "pass_samples" and profile:
                    params["profile"] = "true"
                yield _Call(
                    "PUT",
                    f"{path}/{name}",
                    _parse_metadata_ack,
                    params=params,
                    content=body,
                    resend=_RESEND_METADATA,
                )
        return
    for lo in range(0, n, chunk):
        doc: dict[str, Any] = {"offset": offset + lo}
        for name, values in given.items():
            part = _METADATA_ARRAYS[name][0](values[lo : lo + chunk], lo)
            if name == "pass_rate":
                doc[name] = [None if math.isnan(r) else r for r in part]
            elif name == "pass_samples":
                doc[name] = [None if c < 0 else c for c in part]
            else:
                doc[name] = part
        if profile:
            doc["profile"] = True
        yield _Call("PUT", path, _parse_metadata_ack, json=doc, resend=_RESEND_METADATA)


#: Characters of the encoded ``ids`` value one GET .../beliefs carries at most: httpx and the service's
#: HTTP server refuse URLs over about 64 KiB, so a long id list goes in several requests.
BELIEFS_QUERY_CHARS = 32_000
#: Reads of a long id list before giving up when a step closes between its requests every time.
BELIEFS_READS = 3


def _beliefs_calls(dataset: str, ids: Iterable[int]) -> list[_Call[Beliefs]]:
    """The requests of one beliefs read, in the order of ``ids``, each within ``BELIEFS_QUERY_CHARS``."""
    chunks: list[list[str]] = [[]]
    length = 0
    for i in ids:
        text = str(int(i))
        cost = len(text) + 3  # the id and its comma, sent as %2C
        if chunks[-1] and length + cost > BELIEFS_QUERY_CHARS:
            chunks.append([])
            length = 0
        chunks[-1].append(text)
        length += cost
    path = f"{_dataset_path(dataset)}/beliefs"
    return [_Call("GET", path, _parse_beliefs, params={"ids": ",".join(chunk)}) for chunk in chunks]


def _joined_beliefs(parts: list[Beliefs]) -> Beliefs | None:
    """The answers to one read's requests as one, or None when they reflect different open steps."""
    if len({part.open_step for part in parts}) > 1:
        return None
    return Beliefs(open_step=parts[0].open_step, beliefs=[b for part in parts for b in part.beliefs])


def _moving_step(dataset: str, calls: list[_Call[Beliefs]]) -> Conflict:
    return Conflict(
        f"GET {_dataset_path(dataset)}/beliefs: the ids took {len(calls)} requests, and a step of {dataset!r} "
        f"closed between them in each of {BELIEFS_READS} reads; read fewer ids per call (one request holds "
        "a few thousand) or read while no trainer is selecting",
        status=None,
    )


def _score_call(
    dataset: str, strategy: str, prompt_ids: Iterable[int], params: Mapping[str, Any] | None, seed: int
) -> _Call[Scores]:
    body: dict[str, Any] = {
        "dataset": dataset,
        "strategy": strategy,
        "seed": int(seed),
        "prompt_ids": [int(i) for i in prompt_ids],
    }
    if params:
        body["params"] = dict(params)
    return _Call("POST", "/score", _parse_scores, json=body)


# ---------------------------------------------------------------------------------------------------
# The call's deadline inside httpx's connection pool (blocking client)
# ---------------------------------------------------------------------------------------------------
#: The monotonic time the blocking call running in this thread must end by (``at``; None: none).
_CALL_DEADLINE = threading.local()


def _within_deadline(timeout: float | None, kind: str) -> float | None:
    """``timeout`` of one socket operation, cut to what is left of the running call's deadline; raises
    httpcore's timeout of that ``kind`` (connect | read | write) once nothing is left."""
    at = getattr(_CALL_DEADLINE, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        import httpcore  # loaded already: the pool that calls this is httpcore's

        error = {"connect": httpcore.ConnectTimeout, "write": httpcore.WriteTimeout}.get(
            kind, httpcore.ReadTimeout
        )
        raise error("the call's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream:
    """An httpcore network stream whose every read and write ends by the running call's deadline: httpx's
    timeouts bound one socket operation each, so an answer that trickles in byte by byte never meets
    them (httpcore's NetworkStream interface, httpcore/_backends/base.py)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return bytes(self._inner.read(max_bytes, _within_deadline(timeout, "read")))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _within_deadline(timeout, "write"))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> Any:
        inner = self._inner.start_tls(ssl_context, server_hostname, _within_deadline(timeout, "connect"))
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend:
    """httpcore's network backend (connect, sleep) with `_DeadlineStream` connections."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> _DeadlineStream:
        stream = self._inner.connect_tcp(
            host, port, _within_deadline(timeout, "connect"), local_address, socket_options
        )
        return _DeadlineStream(stream)

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
        return _DeadlineStream(
            self._inner.connect_unix_socket(path, _within_deadline(timeout, "connect"), socket_options)
        )

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _bound_by_deadline(http: httpx.Client) -> bool:
    """Puts `_DeadlineBackend` under the connection pools of ``http``'s own transports (its default one
    and the proxies it mounted from the environment); a transport passed in by the caller keeps its own
    (its calls are then bounded by httpx's timeouts cut to the time left at each attempt). The pool's
    backend is httpcore's ``ConnectionPool._network_backend``, which httpx's transport does not let a
    caller choose; True when at least one pool was bounded."""
    bounded = False
    transports = [getattr(http, "_transport", None), *getattr(http, "_mounts", {}).values()]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is not None and not isinstance(backend, _DeadlineBackend):
            pool._network_backend = _DeadlineBackend(backend)  # type: ignore[union-attr]
            bounded = True
    return bounded


# ---------------------------------------------------------------------------------------------------
# Shared retry policy
# ---------------------------------------------------------------------------------------------------
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def _retry_after(response: httpx.Response | None) -> float | None:
    """The seconds an answer's ``Retry-After`` asks to wait (a number of seconds or an HTTP date), or
    None when it has none that can be read."""
    value = response.headers.get("Retry-After") if response is not None else None
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        from email.utils import parsedate_to_datetime  # here: only a dated Retry-After pays for it

        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - time.time()
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def _replace_headers(call: _Call[T], headers: dict[str, str]) -> _Call[T]:
    return replace(call, headers={**(call.headers or {}), **headers})


class _Attempts:
    """One call's attempts: its deadline, how many were made, whether one may have reached the service,
    and the last failure. ``reached`` starts True for an observe whose request id's last call ended in
    OutcomeUnknown: this call continues it."""

    def __init__(self, deadline_s: float, reached: bool) -> None:
        self.deadline_at = time.monotonic() + deadline_s
        self.count = 0
        self.reached = reached
        self.sent = False  # the current attempt started sending its request
        self.last: BaseException | httpx.Response | None = None
        self.ended = ""  # why no further attempt was made

    def left(self) -> float:
        return self.deadline_at - time.monotonic()

    def start(self, timeout: float) -> httpx.Timeout | None:
        """The timeouts of the next attempt (each cut to the time left), or None when none is left."""
        left = self.left()
        if left <= 0:
            return None
        self.count += 1
        self.sent = False
        return httpx.Timeout(min(timeout, left))

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        """httpcore's trace extension: notes when the attempt starts sending (before its first byte)."""
        if event.endswith("send_request_headers.started"):
            self.sent = True

    async def atrace(self, event: str, info: Mapping[str, Any]) -> None:
        self.trace(event, info)

    def failed(self, what: BaseException | httpx.Response) -> None:
        """Records a failed attempt: an exception, or an answer 502/503/504 (it came from something the
        request reached). An exception of the connect phase before anything was sent reached nothing."""
        self.last = what
        if isinstance(what, httpx.Response) or self.sent or not isinstance(what, _NOT_SENT):
            self.reached = True


class _Base:
    def __init__(
        self,
        base_url: str,
        token: str | None,
        timeout: float,
        retries: int,
        backoff: float,
        deadline: float | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        if backoff < 0:
            raise ValueError("backoff must be >= 0")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if deadline is not None and not deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds (or None for the default), got {deadline!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"service URL must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self.timeout = float(timeout)
        #: Seconds one call may take in all (connect, send, every read, retries and waits).
        self.deadline = (
            float(deadline) if deadline is not None else default_deadline(timeout, retries, backoff)
        )
        self._timeout = httpx.Timeout(timeout)
        self._headers = {"Accept": "application/json", contract.CONTRACT_HEADER: str(contract.CONTRACT)}
        token = token or os.environ.get("SELECTOR_API_TOKEN") or None
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        # request id -> the call id of its last observe, while that ended in OutcomeUnknown
        self._pending: dict[str, str] = {}
        self._pending_lock = threading.Lock()

    # --- one call's attempts ----------------------------------------------------------------------
    def _wait(self, call: _Call[Any], attempts: _Attempts) -> float:
        """After a failed attempt: the seconds to wait before the next one; raises the call's error when
        there is none (retries spent, the deadline passed, or a Retry-After beyond it)."""
        left = attempts.left()
        if left <= 0:
            raise self._deadline_passed(call, attempts)
        if attempts.count > self.retries:
            attempts.ended = f"retries={self.retries} spent"
            raise self._gave_up(call, attempts)
        response = attempts.last if isinstance(attempts.last, httpx.Response) else None
        asked = _retry_after(response)
        delay = (
            asked if asked is not None else min(self.backoff * (2 ** (attempts.count - 1)), _MAX_BACKOFF_S)
        )
        if delay >= left:
            attempts.ended = (
                f"the service asked to retry after {asked:g} s, beyond the call's deadline ({left:.1f} s left "
                f"of {self.deadline:g} s)"
                if asked is not None
                else f"the call's deadline of {self.deadline:g} s leaves no time for another attempt"
            )
            raise self._gave_up(call, attempts)
        return delay

    def _deadline_passed(self, call: _Call[Any], attempts: _Attempts) -> ServiceUnavailable:
        attempts.ended = f"the call's deadline of {self.deadline:g} s passed"
        if attempts.last is None:
            attempts.last = TimeoutError(f"no answer within the call's deadline of {self.deadline:g} s")
        return self._gave_up(call, attempts)

    def _gave_up(self, call: _Call[Any], attempts: _Attempts) -> ServiceUnavailable:
        """The error of a call that got no answer: `OutcomeUnknown` for a write that may have been
        applied, else `ServiceUnavailable` (a write: nothing was applied)."""
        last = attempts.last
        status: int | None = None
        if isinstance(last, httpx.Response):
            status = last.status_code
            detail = _detail_text(last)
            cause = f"HTTP {status}: {detail}"
        else:
            detail = _cause(last) if last is not None else "no attempt was made"
            cause = detail
        tried = (
            f"{_attempts(attempts.count)}, {attempts.ended}" if attempts.ended else _attempts(attempts.count)
        )
        where = f"{call.method} {call.path} at {self.base_url}"
        common: dict[str, Any] = {
            "status": status,
            "detail": detail,
            "method": call.method,
            "path": call.path,
            "attempts": attempts.count,
        }
        if call.resend is not None and attempts.reached:
            return OutcomeUnknown(
                f"{where}: outcome unknown, it may have been applied: a request was sent and no answer "
                f"came back (last: {cause}; {tried}). {call.resend}",
                request_id=call.request_id,
                **common,
            )
        applied = "; it never reached the service, so nothing was applied" if call.resend is not None else ""
        if status is not None:
            return ServiceUnavailable(
                f"{call.method} {call.path} -> HTTP {status} ({tried}): {detail}{applied}", **common
            )
        return ServiceUnavailable(
            f"cannot reach the selector service at {self.base_url}: {call.method} {call.path} failed ({cause}; "
            f"{tried}){applied}; check that it is running (`selector-service serve`) and that the URL is right",
            **common,
        )

    # --- observe call ids -------------------------------------------------------------------------
    def _observe_call_id(self, call: _Call[T]) -> tuple[_Call[T], bool]:
        """The observe with its ``Selector-Call`` header: the call id its request id's last call ended
        with in OutcomeUnknown (this call continues it: True), else a new one."""
        assert call.request_id is not None
        with self._pending_lock:
            pending = self._pending.get(call.request_id)
        call_id = pending or os.urandom(12).hex()
        return _replace_headers(call, {contract.CALL_HEADER: call_id}), pending is not None

    def _observe_ended(self, call: _Call[Any], error: BaseException | None) -> None:
        """Keeps the call id of an observe that ended in OutcomeUnknown (until the caller sends it
        again), forgets it once its request id has an answer."""
        assert call.request_id is not None and call.headers is not None
        with self._pending_lock:
            if isinstance(error, OutcomeUnknown):
                self._pending[call.request_id] = call.headers[contract.CALL_HEADER]
                while len(self._pending) > PENDING_CALLS:
                    del self._pending[next(iter(self._pending))]
            elif not isinstance(error, ServiceUnavailable):
                self._pending.pop(call.request_id, None)

    def _outcome(self, call: _Call[T], response: httpx.Response, attempts: _Attempts) -> T:
        # Every answer of the service names its contract version; one that names none (a proxy's own
        # answer, say) speaks the first.
        problem = contract.mismatch(contract.CONTRACT, response.headers.get(contract.CONTRACT_HEADER))
        if problem:
            raise ContractMismatch(
                f"{call.method} {call.path} at {self.base_url}: {problem}",
                status=response.status_code,
                method=call.method,
                path=call.path,
                attempts=attempts.count,
            )
        if (
            call.method == "DELETE"
            and response.status_code == 404
            and attempts.count > 1
            and attempts.reached
        ):
            return call.parse(response)  # type: ignore[no-any-return]  # an earlier attempt deleted it
        if not response.is_success:
            raise _error_for(
                call.method, call.path, response, token_sent=self._token_sent, attempts=attempts.count
            )
        try:
            return call.parse(response)  # type: ignore[no-any-return]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise SelectorError(
                f"{call.method} {call.path} at {self.base_url} answered HTTP {response.status_code} with a body "
                f"that is not the selector service's ({type(exc).__name__}: {exc}); is --service-url right?",
                status=response.status_code,
                method=call.method,
                path=call.path,
                attempts=attempts.count,
            ) from None

    @property
    def _token_sent(self) -> bool:
        return "Authorization" in self._headers

    def _check_server_message(self, exc: SelectorError) -> SelectorError:
        if isinstance(exc, AuthError) and exc.status == 401 and not self._token_sent:
            return AuthError(
                f"the selector service at {self.base_url} requires a token and none was sent (HTTP 401): "
                "pass the service's token with --token or SELECTOR_API_TOKEN",
                status=exc.status,
                detail=exc.detail,
            )
        if isinstance(exc, AuthError):
            return AuthError(
                f"the selector service at {self.base_url} rejected the token (HTTP {exc.status}): "
                "pass the service's token with --token or SELECTOR_API_TOKEN",
                status=exc.status,
                detail=exc.detail,
            )
        if isinstance(exc, NotFound):
            return SelectorError(
                f"{self.base_url} does not look like the selector service ({exc}); is --service-url right?",
                status=exc.status,
                detail=exc.detail,
            )
        if isinstance(exc, ServiceUnavailable) and exc.status == 503:
            return ServiceUnavailable(
                f"the selector service at {self.base_url} is up but not ready ({exc.detail}); "
                "check that its Redis/Valkey store is reachable",
                status=503,
                detail=exc.detail,
            )
        return exc


class SelectorClient(_Base):
    """Blocking client. Use as a context manager (or call ``close()``) to release connections.

    ``token``: the service's bearer token; when none is passed (None or empty) the client reads
    ``SELECTOR_API_TOKEN``, and sends no token when that is unset or empty.

    ``timeout``: seconds for each connect, send and read of an attempt; ``retries``, ``backoff``: the
    retry schedule; ``deadline``: seconds one call may take in all, retries and waits included (None:
    `default_deadline`). See the module docstring for what each error means and what to do.

    ``transport`` is a seam for tests (e.g. wrapping the real transport to drop a response); a call
    through it is bounded by the timeouts cut to the time left at each attempt.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        *,
        deadline: float | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, token, timeout, retries, backoff, deadline)
        self._http = httpx.Client(
            base_url=self.base_url, headers=self._headers, timeout=self._timeout, transport=transport
        )
        _bound_by_deadline(self._http)

    def __enter__(self) -> SelectorClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, call: _Call[T], continues: bool = False) -> T:
        attempts = _Attempts(self.deadline, continues)
        outer = getattr(_CALL_DEADLINE, "at", None)
        _CALL_DEADLINE.at = attempts.deadline_at  # read by _DeadlineStream in this thread
        try:
            while True:
                timeout = attempts.start(self.timeout)
                if timeout is None:
                    raise self._deadline_passed(call, attempts)
                try:
                    response = self._http.request(
                        call.method,
                        call.path,
                        timeout=timeout,
                        extensions={"trace": attempts.trace},
                        **call.send_kwargs(),
                    )
                except httpx.TransportError as exc:  # connect errors, timeouts, dropped connections
                    attempts.failed(exc)
                else:
                    if response.status_code not in _RETRY_STATUSES:
                        return self._outcome(call, response, attempts)
                    attempts.failed(response)
                time.sleep(self._wait(call, attempts))
        finally:
            _CALL_DEADLINE.at = outer

    # --- datasets ---------------------------------------------------------------------------------
    def create_dataset(
        self,
        name: str,
        size: int,
        rollouts_per_prompt: int = _DEFAULT["rollouts_per_prompt"],
        success_threshold: float = _DEFAULT["success_threshold"],
        beta_prior: tuple[float, float] = _DEFAULT["beta_prior"],
        beta_decay: float = _DEFAULT["beta_decay"],
        hmm_decay: float = _DEFAULT["hmm_decay"],
        reward_mode: str = _DEFAULT["reward_mode"],
        defaults: Mapping[str, Any] | None = None,
        max_lag: int = _DEFAULT["max_lag"],
        prior_strength: float = _DEFAULT["prior_strength"],
        group_decay: float = _DEFAULT["group_decay"],
    ) -> DatasetInfo:
        """Create a dataset (or confirm an identical one); ``Conflict`` if the name has another spec.
        The settings and their defaults are contract.py's, their domains the service's (docs/api.md);
        ``max_lag``: accept results up to this many steps late (asynchronous trainers);
        ``prior_strength`` / ``group_decay``: docs/methods.md §6. A setting given as None has its default."""
        return self._run(_create_dataset_call(locals()))

    def upload_metadata(
        self,
        dataset: str,
        *,
        pass_rate: Sequence[float | None] | None = None,
        group: Sequence[int] | None = None,
        offset: int = 0,
        raw: bool | None = None,
        pass_samples: Sequence[int | None] | None = None,
        profile: bool = False,
    ) -> MetadataAck:
        """Upload per-prompt prior pass rates (None/NaN = unknown), the samples each was measured from
        (``pass_samples``, whole numbers 1..1,000,000, None = unknown: the rate then weighs the dataset's
        prior_strength) and/or groups (0..65535, -1 = none) for prompts ``offset .. offset + len - 1``
        (docs/methods.md §6). ``profile=True``: those samples were rolled out for this run, and the
        dataset counts them as its profiling rollouts (docs/api.md section 2). Every value is checked
        before anything is sent. Large uploads go in several requests, JSON or (``raw``, default above
        100k prompts) little-endian float32 / int32 bodies, built one at a time. Each request is applied
        whole or not at all and re-sending the same values changes nothing (profiling included), so a
        failed upload is repaired by sending it again. Returns the last request's answer (coverage and
        profiling rollouts after all)."""
        ack = None
        for call in _metadata_calls(dataset, pass_rate, group, offset, raw, pass_samples, profile):
            ack = self._run(call)
        assert ack is not None
        return ack

    def get_dataset(self, name: str) -> DatasetInfo:
        return self._run(_Call("GET", _dataset_path(name), _parse_dataset))

    def list_datasets(self) -> list[str]:
        """Names of the datasets the service holds."""
        return self._run(_Call("GET", "/datasets", _parse_dataset_names))

    def delete_dataset(self, name: str) -> None:
        self._run(_delete_call(name))

    # --- selection and feedback -------------------------------------------------------------------
    def select(
        self,
        dataset: str,
        step: int,
        batch_size: int,
        strategy: str,
        params: Mapping[str, Any] | None = None,
        seed: int = 0,
        return_scores: bool = False,
        rollouts: RolloutBudget | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> Selection:
        """The prompts to train on at ``step``; the same arguments give the same batch. With
        ``rollouts``, the answer also says how many rollouts each prompt gets (``Selection.rollouts``);
        with ``filter`` (e.g. ``{}`` for the defaults, or ``{"solved": 0.6, "recheck": 0.05}``), none of
        the prompts almost surely solved or hopeless (docs/api.md section 3)."""
        return self._run(
            _select_call(dataset, step, batch_size, strategy, params, seed, return_scores, rollouts, filter)
        )

    def observe(
        self,
        dataset: str,
        step: int,
        results: Iterable[Result],
        request_id: str,
        selected_step: int | None = None,
    ) -> ObserveAck:
        """Report rollout outcomes; retries reuse ``request_id`` so they are applied at most once, and the
        answer counts what this call applied even when a retry found its first attempt applied. With
        ``selected_step`` (the step the prompts were selected at) a group that comes back more than the
        dataset's ``max_lag`` steps late is filed at the open step instead of refused (docs/api.md, 4).
        `OutcomeUnknown`: send the same observe again (module docstring)."""
        call, continues = self._observe_call_id(
            _observe_call(dataset, step, results, request_id, selected_step)
        )
        try:
            ack = self._run(call, continues)
        except SelectorError as exc:
            self._observe_ended(call, exc)
            raise
        self._observe_ended(call, None)
        return ack

    def beliefs(self, dataset: str, ids: Iterable[int]) -> Beliefs:
        """The beliefs about ``ids``, in that order, at one open step. A URL holds a few thousand ids, so
        more go in several requests; when a step closes between them the read starts over (``Conflict``
        after ``BELIEFS_READS`` reads)."""
        calls = _beliefs_calls(dataset, ids)
        for _ in range(BELIEFS_READS):
            joined = _joined_beliefs([self._run(call) for call in calls])
            if joined is not None:
                return joined
        raise _moving_step(dataset, calls)

    def score(
        self,
        dataset: str,
        strategy: str,
        prompt_ids: Iterable[int],
        params: Mapping[str, Any] | None = None,
        seed: int = 0,
    ) -> Scores:
        """Scores a ``/select`` at the open step would give these prompts (writes nothing)."""
        return self._run(_score_call(dataset, strategy, prompt_ids, params, seed))

    # --- operations -------------------------------------------------------------------------------
    def healthz(self) -> dict[str, Any]:
        return self._run(_Call("GET", "/healthz", _json))

    def readyz(self) -> dict[str, Any]:
        return self._run(_Call("GET", "/readyz", _json))

    def strategies(self) -> dict[str, dict[str, Any]]:
        """The strategies the service offers: {name: {parameter: default}} (GET /strategies)."""
        return self._run(_Call("GET", "/strategies", _parse_strategies))

    def check_server(self) -> None:
        """Raise a ``SelectorError`` that says what to fix unless the service is up, ready, speaks this
        client's contract version (`ContractMismatch` says which package to upgrade; every call checks it)
        and accepts our token. Cheap: three GET requests."""
        try:
            self.healthz()
            self.readyz()
            self.list_datasets()  # the first endpoint behind the token
        except SelectorError as exc:
            raise self._check_server_message(exc) from None

    def check_url(self) -> None:
        """Raise a `SelectorError` that names ``base_url`` unless it is the selector service's root:
        ``GET /healthz`` answers 200 with the contract header every answer of the service carries. A base
        URL with a path the service does not serve (``.../api``) answers every path with 404, which would
        read as a missing dataset; callers that take a 404 to mean "missing" ask this first."""
        call: _Call[Any] = _Call("GET", "/healthz", _json)
        try:
            response = self._http.request(call.method, call.path, **call.send_kwargs())
        except httpx.TransportError as exc:
            raise self._unreachable(call, exc, 1) from None
        if response.is_success and contract.CONTRACT_HEADER in response.headers:
            return
        answer = f"HTTP {response.status_code}"
        if response.is_success:
            answer += f" without the {contract.CONTRACT_HEADER} header the service sends"
        raise SelectorError(
            f"{self.base_url} is not the selector service's URL: GET {self.base_url}/healthz answered {answer}. "
            "Check the URL: it is the address `selector-service serve` prints (e.g. http://127.0.0.1:8000), "
            "with no path after it",
            status=response.status_code,
        )


class AsyncSelectorClient(_Base):
    """The same API as ``SelectorClient`` with ``async`` methods (for asyncio trainers); the token as there."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        *,
        deadline: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, token, timeout, retries, backoff, deadline)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers, timeout=self._timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncSelectorClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _run(self, call: _Call[T], continues: bool = False) -> T:
        import asyncio  # here, not at the top: the blocking client's users do not pay its import

        attempts = _Attempts(self.deadline, continues)
        try:
            # The whole call, every read of a trickling answer and every wait included, ends by the deadline.
            async with asyncio.timeout(attempts.left()):
                return await self._attempt(call, attempts)
        except TimeoutError:
            if attempts.sent:
                attempts.reached = True  # cut off while its request was on the wire
            raise self._deadline_passed(call, attempts) from None

    async def _attempt(self, call: _Call[T], attempts: _Attempts) -> T:
        import asyncio

        while True:
            timeout = attempts.start(self.timeout)
            if timeout is None:
                raise TimeoutError
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    timeout=timeout,
                    extensions={"trace": attempts.atrace},
                    **call.send_kwargs(),
                )
            except httpx.TransportError as exc:  # connect errors, timeouts, dropped connections
                attempts.failed(exc)
            else:
                if response.status_code not in _RETRY_STATUSES:
                    return self._outcome(call, response, attempts)
                attempts.failed(response)
            attempts.sent = False  # waiting, nothing on the wire
            await asyncio.sleep(self._wait(call, attempts))

    async def create_dataset(
        self,
        name: str,
        size: int,
        rollouts_per_prompt: int = _DEFAULT["rollouts_per_prompt"],
        success_threshold: float = _DEFAULT["success_threshold"],
        beta_prior: tuple[float, float] = _DEFAULT["beta_prior"],
        beta_decay: float = _DEFAULT["beta_decay"],
        hmm_decay: float = _DEFAULT["hmm_decay"],
        reward_mode: str = _DEFAULT["reward_mode"],
        defaults: Mapping[str, Any] | None = None,
        max_lag: int = _DEFAULT["max_lag"],
        prior_strength: float = _DEFAULT["prior_strength"],
        group_decay: float = _DEFAULT["group_decay"],
    ) -> DatasetInfo:
        return await self._run(_create_dataset_call(locals()))

    async def upload_metadata(
        self,
        dataset: str,
        *,
        pass_rate: Sequence[float | None] | None = None,
        group: Sequence[int] | None = None,
        offset: int = 0,
        raw: bool | None = None,
        pass_samples: Sequence[int | None] | None = None,
        profile: bool = False,
    ) -> MetadataAck:
        ack = None
        for call in _metadata_calls(dataset, pass_rate, group, offset, raw, pass_samples, profile):
            ack = await self._run(call)
        assert ack is not None
        return ack

    async def get_dataset(self, name: str) -> DatasetInfo:
        return await self._run(_Call("GET", _dataset_path(name), _parse_dataset))

    async def list_datasets(self) -> list[str]:
        return await self._run(_Call("GET", "/datasets", _parse_dataset_names))

    async def delete_dataset(self, name: str) -> None:
        await self._run(_delete_call(name))

    async def select(
        self,
        dataset: str,
        step: int,
        batch_size: int,
        strategy: str,
        params: Mapping[str, Any] | None = None,
        seed: int = 0,
        return_scores: bool = False,
        rollouts: RolloutBudget | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> Selection:
        return await self._run(
            _select_call(dataset, step, batch_size, strategy, params, seed, return_scores, rollouts, filter)
        )

    async def observe(
        self,
        dataset: str,
        step: int,
        results: Iterable[Result],
        request_id: str,
        selected_step: int | None = None,
    ) -> ObserveAck:
        call, continues = self._observe_call_id(
            _observe_call(dataset, step, results, request_id, selected_step)
        )
        try:
            ack = await self._run(call, continues)
        except SelectorError as exc:
            self._observe_ended(call, exc)
            raise
        self._observe_ended(call, None)
        return ack

    async def beliefs(self, dataset: str, ids: Iterable[int]) -> Beliefs:
        calls = _beliefs_calls(dataset, ids)
        for _ in range(BELIEFS_READS):
            joined = _joined_beliefs([await self._run(call) for call in calls])
            if joined is not None:
                return joined
        raise _moving_step(dataset, calls)

    async def score(
        self,
        dataset: str,
        strategy: str,
        prompt_ids: Iterable[int],
        params: Mapping[str, Any] | None = None,
        seed: int = 0,
    ) -> Scores:
        return await self._run(_score_call(dataset, strategy, prompt_ids, params, seed))

    async def healthz(self) -> dict[str, Any]:
        return await self._run(_Call("GET", "/healthz", _json))

    async def readyz(self) -> dict[str, Any]:
        return await self._run(_Call("GET", "/readyz", _json))

    async def strategies(self) -> dict[str, dict[str, Any]]:
        return await self._run(_Call("GET", "/strategies", _parse_strategies))

    async def check_server(self) -> None:
        try:
            await self.healthz()
            await self.readyz()
            await self.list_datasets()
        except SelectorError as exc:
            raise self._check_server_message(exc) from None
