"""Request and response bodies of the REST contract (docs/api.md), as pydantic models.

Every request model forbids unknown fields and non-finite numbers, so a typo or a NaN is a clear 422
instead of a silently ignored field or a poisoned posterior.
"""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal, NamedTuple

import msgspec
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from rlvr_selector_client import contract
from selector_service.contract import dataset_settings
from selector_service.contract.jsonscan import array_separators
from selector_service.core.domain import K_MAX, TRIALS_MAX
from selector_service.core.filter import FILTER_SETTINGS
from selector_service.core.rollouts import DEFAULT_ROLLOUT_POLICY, ROLLOUT_POLICIES, ROLLOUT_POLICY_HELP
from selector_service.core.strategies import STRATEGIES


def _strategies_doc() -> str:
    """Every strategy with its parameters and defaults, from the registry (core/strategies.py)."""
    parts = []
    for name, spec in STRATEGIES.items():
        params = ", ".join(
            f"{p} ({'null' if param.default is None else param.default}"
            f"{'; fixed by the dataset: set it in its defaults' if param.dataset_level else ''})"
            for p, param in spec.params.items()
        )
        parts.append(f"{name}: {params or '-'}")
    return "; ".join(parts)


# The bounds of the fields that ObserveRequest and its fast twin (msgspec structs, below) both check,
# declared once: pydantic's Field and msgspec's Meta take them by the same names.
_STEP_BOUNDS: dict[str, Any] = {"ge": 0, "le": contract.MAX_STEP}
_PROMPT_ID_BOUNDS: dict[str, Any] = {"ge": 0, "le": 2**62}
_REQUEST_ID_BOUNDS: dict[str, Any] = {"min_length": 1, "max_length": contract.REQUEST_ID_MAX}
_REWARDS_BOUNDS: dict[str, Any] = {"max_length": 65536}
_SUCCESSES_BOUNDS: dict[str, Any] = {"ge": 0}
_TRIALS_BOUNDS: dict[str, Any] = {"ge": 1, "le": TRIALS_MAX}

DatasetName = Annotated[str, Field(pattern=f"^{dataset_settings.NAME}$", description=dataset_settings.NAME)]
Step = Annotated[int, Field(**_STEP_BOUNDS, description="Training step (>= 0).")]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1, description="Seed of the selection's randomness.")]
PromptId = Annotated[int, Field(**_PROMPT_ID_BOUNDS)]
RequestId = Annotated[
    str,
    Field(
        **_REQUEST_ID_BOUNDS,
        pattern=f"^{contract.REQUEST_ID}$",
        description=f"1..{contract.REQUEST_ID_MAX} printable chars",
    ),
]


class _Request(BaseModel):
    # strict: "3" is not a step and 1 is not a boolean (an int is still accepted where a float is asked).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


# The dataset bodies' settings fields are the contract's (rlvr_selector_client/contract.py), in its order (the
# classes carry no docstring: it would become their description in the OpenAPI document).
_CreateSettings = create_model(
    "_CreateSettings", __base__=_Request, __module__=__name__, **dataset_settings.create_fields()
)
_InfoSettings = create_model("_InfoSettings", __module__=__name__, **dataset_settings.info_fields())


class DatasetCreate(_CreateSettings):  # type: ignore[valid-type, misc]  # a create_model class, built at import
    pass


class DatasetInfo(_InfoSettings):  # type: ignore[valid-type, misc]  # a create_model class, built at import
    created: bool | None = Field(None, description="On POST: true when this call created it.")
    summary: dict[str, Any] | None = Field(
        None,
        description="open_step, observations, rollouts, prompts_observed, steps_closed, "
        "last_step_partial_share, last_step_dps_accuracy, metadata coverage: "
        "prompts_with_pass_rate, prompts_with_group, groups (groups with at least one prompt), "
        "prompts_with_pass_samples; profile_rollouts (rollouts spent profiling the prompts) and "
        "total_rollouts (rollouts plus profile_rollouts)",
    )


class DatasetList(BaseModel):
    datasets: list[str]


class RolloutBudget(_Request):
    """How many rollouts the step has for its batch_size prompts, and how to share them out
    (docs/methods.md §8). budget must lie in [batch_size x min, batch_size x max] (422 otherwise)."""

    budget: int = Field(
        ge=1,
        le=10**12,
        description="Total rollouts of the step over the batch_size prompts, in [batch_size x min, "
        "batch_size x max].",
    )
    min: int = Field(1, ge=1, le=K_MAX, description="Fewest rollouts of one prompt (>= 1).")
    max: int | None = Field(
        None,
        ge=1,
        le=K_MAX,
        description=f"Most rollouts of one prompt, >= min and at most the K limit {K_MAX}; null = {K_MAX}.",
    )
    # A Literal of core's tuple of names: pydantic expands it at runtime, mypy only takes literal values.
    policy: Literal[ROLLOUT_POLICIES] = Field(  # type: ignore[valid-type]
        DEFAULT_ROLLOUT_POLICY,
        description="How the budget is shared: "
        + "; ".join(f"{name}: {help_}" for name, help_ in ROLLOUT_POLICY_HELP.items()),
    )


def _filter_fields() -> dict[str, Any]:
    """The filter's fields: its settings' declaration (core/filter.py), in its order."""
    bounds: dict[str, dict[str, Any]] = {name: dict(s.bounds) for name, s in FILTER_SETTINGS.items()}
    return {
        name: (s.type, Field(s.default, description=s.help, **bounds[name]))
        for name, s in FILTER_SETTINGS.items()
    }


_FilterSettings = create_model("_FilterSettings", __base__=_Request, __module__=__name__, **_filter_fields())


class SelectFilter(_FilterSettings):  # type: ignore[valid-type, misc]  # a create_model class, built at import
    """Keep out of the batch the prompts whose belief says they are almost surely solved or hopeless
    (docs/methods.md §9): a prompt is dropped when the Beta-binomial probability that a group of k of its
    rollouts all succeed is >= solved, or all fail is >= unsolved."""


class SelectRequest(_Request):
    dataset: DatasetName
    step: Step
    batch_size: int = Field(ge=1, description="How many distinct prompts to return.")
    strategy: str = Field("insight", description=" | ".join(STRATEGIES))
    params: dict[str, Any] | None = Field(
        None,
        description="Strategy parameter overrides (unknown names: 422). Parameters (default): "
        + _strategies_doc(),
    )
    seed: Seed = 0
    return_scores: bool = False
    rollouts: RolloutBudget | None = Field(
        None,
        description="Optional: a rollout budget; the answer then says how many rollouts each prompt gets.",
    )
    filter: SelectFilter | None = Field(
        None,
        description="Optional: leave out the prompts almost surely solved or hopeless (not with greso, sec, or "
        "strategy filter, which takes these settings as its params).",
    )


class SelectResponse(BaseModel):
    dataset: str
    step: int
    strategy: str
    prompt_ids: list[int]
    scores: list[float] | None
    rollouts: list[int] | None = Field(
        None,
        description="Only when the request carried `rollouts`: the rollouts of each prompt of prompt_ids "
        "(same order), each in [min, max], summing to the budget exactly.",
    )


class Result(_Request):
    prompt_id: PromptId
    rewards: Annotated[list[float], Field(**_REWARDS_BOUNDS)] | None = Field(
        None, description="One reward per rollout."
    )
    successes: Annotated[float, Field(**_SUCCESSES_BOUNDS)] | None = Field(
        None, description="With trials, instead of rewards."
    )
    trials: Annotated[int, Field(**_TRIALS_BOUNDS)] | None = None


class ObserveRequest(_Request):
    dataset: DatasetName
    step: Step
    request_id: RequestId
    results: list[Result] = Field(min_length=1)
    selected_step: Annotated[int, Field(**_STEP_BOUNDS)] | None = Field(
        None,
        description="The step the results' prompts were selected at (<= step), their evidence time: with "
        "it, a step closed more than max_lag steps ago is not refused but filed at the open step, its lag "
        "counted from selected_step (an extension of the contract; docs/api.md section 4).",
    )


class ObserveResponse(BaseModel):
    applied: int = Field(description="Results applied by this call (0 for a duplicate).")
    duplicate: bool = Field(description="True when this request id was applied before (nothing applied now).")
    lag: int = Field(
        0,
        description="Steps between the step reported (selected_step when given) and the open step it was "
        "applied at (0 = on time). A duplicate answers the first call's lag.",
    )


class Belief(BaseModel):
    prompt_id: int
    alpha: float = Field(
        description="Beta posterior now; a never-observed prompt's cold prior (docs/methods.md §6)."
    )
    beta: float
    mean: float
    observations: int
    hmm_prior: list[float]
    group: int = Field(-1, description="The prompt's group (docs/methods.md §6); -1 = none.")
    prior_pass_rate: float | None = Field(
        None,
        description="The pass rate its Beta prior is built from: frozen at its first observation; before "
        "it, its own pass rate or its group's current rate. null = none (Beta(alpha0, beta0)).",
    )


class BeliefsResponse(BaseModel):
    open_step: int
    beliefs: list[Belief]


class GroupFigures(BaseModel):
    results: int = Field(description="Results applied at the step for prompts of the group.")
    mean_reward: float | None = Field(description="Their successes / trials.")


class HistoryRow(BaseModel):
    """One closed step (docs/api.md, "Step history"; shares are null when the step had no result)."""

    step: int
    selected: int = Field(description="Prompts selected at the step: the batch sizes of its select requests.")
    selects: int = Field(description="Select requests of the step (a request sent again counts once).")
    observed: int = Field(description="Prompts observed at the step.")
    results: int = Field(description="Results applied while the step was open (late ones included).")
    rollouts: float = Field(description="Their trials.")
    mean_reward: float | None = Field(description="Their successes / trials.")
    all_solved: float | None = Field(description="Share of the step's results whose rollouts all succeeded.")
    mixed: float | None = Field(description="... some but not all succeeded (a learning signal for GRPO).")
    none_solved: float | None = Field(description="... none succeeded.")
    dps_predicted: list[float] | None = Field(
        description="DPS's belief (unsolved, partially solved, solved) averaged over the prompts observed "
        "at the step, before their results."
    )
    dps_accuracy: float | None = Field(
        description="Share of those prompts whose most likely DPS state was the one observed."
    )
    late: dict[str, int] = Field(description='Late results applied at the step by lag ("1" .. "7", "8+").')
    strategies: dict[str, int] = Field(description="Select requests of the step by strategy.")
    prompts_observed: int = Field(description="Prompts ever observed when the step closed.")
    groups: dict[str, GroupFigures] | None = Field(
        None,
        description="Per group (metadata): the step's results and mean reward, for the 8 groups with most.",
    )
    groups_omitted: int | None = Field(None, description="Groups with results at the step beyond those 8.")
    profile_rollouts: int = Field(
        0, description="The dataset's profiling rollouts when the step closed (docs/api.md section 2)."
    )
    total_rollouts: float = Field(
        0,
        description="Every rollout applied by the step's close (this step and all before it), profiling included.",
    )


class HistoryResponse(BaseModel):
    dataset: str
    open_step: int
    rows: list[HistoryRow]
    next: int = Field(description="The `since` that asks for the rows after these.")
    profile_rollouts: int = Field(0, description="The dataset's profiling rollouts now.")
    total_rollouts: int = Field(0, description="Every rollout of the run now: observed plus profiling.")


class ScoreRequest(_Request):
    dataset: DatasetName
    strategy: str
    params: dict[str, Any] | None = None
    seed: Seed = 0
    prompt_ids: list[PromptId] = Field(min_length=1)


class ScoreResponse(BaseModel):
    open_step: int
    scores: list[float]


class StrategyParamInfo(BaseModel):
    name: str
    default: Any = Field(description="The value used when a request does not give one (null: see help).")
    help: str
    dataset_level: bool = Field(
        description="Shapes state the dataset updates at every step close: fixed per dataset through its "
        "`defaults` at creation; a request may repeat the dataset's value but not change it."
    )


class StrategyInfo(BaseModel):
    name: str
    scored: bool = Field(description="Its selects return scores and POST /score answers for it.")
    deterministic: bool = Field(description="Its scores depend on the beliefs alone (no random draws).")
    params: list[StrategyParamInfo]


class RolloutPolicyInfo(BaseModel):
    name: str
    default: bool = Field(description="The policy a rollout budget without `policy` gets.")
    help: str


class StrategiesResponse(BaseModel):
    strategies: list[StrategyInfo]
    rollout_policies: list[RolloutPolicyInfo] = Field(
        default_factory=list, description="The policies a select's `rollouts.policy` accepts."
    )
    filter: list[StrategyParamInfo] = Field(
        default_factory=list, description="The settings a select's `filter` accepts, with their defaults."
    )


PassRate = Annotated[float, Field(ge=0, le=1)]
GroupId = Annotated[int, Field(ge=-1, le=contract.MAX_GROUPS - 1)]
PassSamples = Annotated[int, Field(ge=1, le=contract.PASS_SAMPLES_MAX)]
#: The per-prompt arrays of a metadata upload, in the order their lengths are compared.
_METADATA_ARRAYS = ("pass_rate", "pass_samples", "group")


class MetadataRequest(_Request):
    """Per-prompt metadata for prompts offset .. offset + len - 1 (docs/methods.md §6)."""

    offset: int = Field(0, ge=0, le=2**62, description="Prompt id of the first value.")
    pass_rate: list[PassRate | None] | None = Field(
        None, description="A reference pass rate in [0, 1] per prompt; null = unknown."
    )
    pass_samples: list[PassSamples | None] | None = Field(
        None,
        description=f"The samples each pass rate was measured from, a whole number in 1..{contract.PASS_SAMPLES_MAX}: "
        "the rate then weighs as that many samples in the prompt's Beta prior; null = unknown (the "
        "dataset's prior_strength). Same length as the other arrays.",
    )
    profile: bool = Field(
        False,
        description="True: the pass_samples were rolled out for this run (a profiling pass) and count as "
        "its profiling rollouts; false: they came with the data (free). Needs pass_samples.",
    )
    group: list[GroupId] | None = Field(
        None,
        description=f"A group in 0..{contract.MAX_GROUPS - 1} per prompt; -1 = none. Same length as pass_rate.",
    )

    @model_validator(mode="after")
    def _lengths(self) -> MetadataRequest:
        given = {name: getattr(self, name) for name in _METADATA_ARRAYS if getattr(self, name) is not None}
        if not given:
            raise ValueError("send pass_rate, pass_samples, group, or several of them")
        if self.profile and self.pass_samples is None:
            raise ValueError(
                "profile is true but pass_samples is missing: profile counts the samples behind the rates, "
                "send them as pass_samples"
            )
        lengths = {len(v) for v in given.values()}
        if len(lengths) != 1:
            sizes = " and ".join(f"{name} {len(v)}" for name, v in given.items())
            raise ValueError(f"the arrays differ in length ({sizes}): send one per prompt in each")
        if lengths == {0}:
            raise ValueError("the arrays are empty: send at least one prompt's values")
        return self


class MetadataCoverage(BaseModel):
    prompts_with_pass_rate: int
    prompts_with_group: int
    groups: int = Field(description="Groups with at least one prompt.")
    prompts_with_pass_samples: int = Field(0, description="Prompts whose pass rate has a sample count.")


class MetadataResponse(BaseModel):
    dataset: str
    offset: int
    count: int = Field(description="Prompts this upload set.")
    coverage: MetadataCoverage = Field(description="The dataset's metadata once this upload is applied.")
    profile_rollouts: int = Field(
        0,
        description="The dataset's profiling rollouts once this upload is applied: the sum of the sample "
        "counts it holds that were uploaded with profile true.",
    )


class ErrorBody(BaseModel):
    detail: str


class Health(BaseModel):
    status: Literal["ok", "ready", "not ready"]
    detail: str | None = None


# ---------------------------------------------------------------------------------------------------------
# The observe body's fast twin. POST /observe is the hot write path and its bodies reach 16 MiB (480k
# results): pydantic builds a model object per result (36x the body in memory) inside one C call that
# holds the GIL for seconds, stalling the event loop even from a worker thread. msgspec decodes the same
# JSON into slotted structs about 30x faster and 6x smaller, so that one decode holds the GIL for tens of
# milliseconds. The structs below are ObserveRequest field for field (ObserveRequest stays the contract:
# the OpenAPI document describes it, and its messages answer bodies these structs refuse);
# tests/service/test_observe_parse.py checks that both accept and refuse the same bodies.
#
# Why this path is ours and not a library's: the body's shape, an array of result objects, is the REST
# contract every trainer integration and REST client sends (API.md), so a binary observe body like the
# metadata upload's could only be added beside it, and this path would still have to be fast. Decoding
# is done by msgspec (maintained, schema-checked); what it lacks is a way to decode one array in pieces
# while releasing the GIL between them. Measured on a 21.6 MiB body of 300k results (one run, this
# machine): msgspec's one call over the whole body 412 ms with the GIL held; pydantic's several seconds;
# the passes below 467 ms in all, no single call over ~30 ms. The pieces are cut at the array's
# top-level commas (jsonscan.py, numba, nogil: a Python loop over the bytes takes seconds, msgspec's
# `list[Raw]` holds the GIL for the whole scan).

# msgspec matches with Python's `re`, whose `$` also matches before a final newline: `\Z` ends the text, as
# `$` does in pydantic's (Rust) patterns above.
_NAME = msgspec.Meta(pattern=f"^{dataset_settings.NAME}\\Z")
_REQUEST_ID = msgspec.Meta(**_REQUEST_ID_BOUNDS, pattern=f"^{contract.REQUEST_ID}\\Z")
_STEP = msgspec.Meta(**_STEP_BOUNDS)


class FastResult(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    prompt_id: Annotated[int, msgspec.Meta(**_PROMPT_ID_BOUNDS)]
    rewards: Annotated[list[float], msgspec.Meta(**_REWARDS_BOUNDS)] | None = None
    successes: Annotated[float, msgspec.Meta(**_SUCCESSES_BOUNDS)] | None = None
    trials: Annotated[int, msgspec.Meta(**_TRIALS_BOUNDS)] | None = None


class FastObserve(msgspec.Struct, gc=False):
    """A decoded observe body: ObserveRequest's fields, its results packed (PackedResults)."""

    dataset: str
    step: int
    request_id: str
    results: Any
    selected_step: int | None = None


class _ObserveHead(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The observe body with its results left as raw JSON (its syntax checked, nothing decoded)."""

    dataset: Annotated[str, _NAME]
    step: Annotated[int, _STEP]
    request_id: Annotated[str, _REQUEST_ID]
    results: msgspec.Raw
    selected_step: Annotated[int, _STEP] | None = None


class _ObserveWhole(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The observe body decoded in one call: only to word the refusal of a body whose results are not
    a non-empty array (the batches never see such a body)."""

    dataset: Annotated[str, _NAME]
    step: Annotated[int, _STEP]
    request_id: Annotated[str, _REQUEST_ID]
    results: Annotated[list[FastResult], msgspec.Meta(min_length=1)]
    selected_step: Annotated[int, _STEP] | None = None


_HEAD_DECODER = msgspec.json.Decoder(_ObserveHead)
_WHOLE_DECODER = msgspec.json.Decoder(_ObserveWhole)
_RESULTS_DECODER = msgspec.json.Decoder(list[FastResult])
#: Results decoded per call. One call holds the GIL throughout (a few milliseconds per ten thousand
#: results): between calls the event loop's thread gets it back, so a 16 MiB body never stalls the loop
#: for more than one batch.
RESULTS_PER_CALL = 8192
_AT = re.compile(r" - at `\$(.*)`$")


def _opening(array: memoryview) -> int:
    """Index of the opening bracket of a JSON array's text (JSON whitespace may precede it)."""
    i = 0
    while i < len(array) and array[i] in b" \t\r\n":
        i += 1
    return i


def _problem(exc: msgspec.ValidationError, first: int | None = None) -> str:
    """validation_message's form of a msgspec error: `field.path: problem`; `first` is the index of the
    first result of a batch the error is about (its path then starts at the batch's index)."""
    text = str(exc)
    match = _AT.search(text)
    where = match.group(1) if match else ""
    if first is not None:
        where = re.sub(r"^\[(\d+)\]", lambda m: f".results[{first + int(m.group(1))}]", where)
    loc = re.sub(r"\[(\d+)\]", r".\1", where).strip(".")
    problem = text[: match.start()] if match else text
    return f"{loc}: {problem}" if loc else problem


def decode_observe(raw: bytes) -> tuple[FastObserve | None, str]:
    """(the observe body, "") decoded by the fast twin, or (None, why it was refused) in the words of
    validation_message: `field.path: problem`, or `body is not valid JSON (...)`.

    The body is read in passes: its fields with the results array kept as raw JSON (one call that
    checks its syntax and decodes none of it), the array's top-level commas (jsonscan, without the GIL),
    then the results RESULTS_PER_CALL at a time. The cyclic garbage collector is off
    meanwhile: the decode makes hundreds of thousands of short-lived lists, which reference counting
    frees, and which would otherwise trigger full collections of about 100 ms each, every one holding
    the GIL the event loop's thread waits for.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _decode_observe(raw)
    finally:
        if collecting:
            gc.enable()


def _decode_observe(raw: bytes) -> tuple[FastObserve | None, str]:
    try:
        head = _HEAD_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        return None, _problem(exc)
    except msgspec.DecodeError as exc:
        return None, f"body is not valid JSON ({exc}): send UTF-8 JSON; NaN and Infinity are not allowed"
    head_fields = (head.dataset, head.step, head.request_id, head.selected_step)
    array = memoryview(head.results).cast("B")
    seps = array_separators(array)
    opening = _opening(array)
    if seps is None or (seps.size == 1 and not bytes(array[opening + 1 : int(seps[0])]).strip()):
        try:  # not a non-empty array: the one-call decoder words the refusal (a small body, then)
            _WHOLE_DECODER.decode(raw)
        except msgspec.ValidationError as exc:
            return None, _problem(exc)
        return None, "results: Expected `array` of length >= 1"
    count = int(seps.size)
    packed = _Packer(count)
    for lo in range(0, count, RESULTS_PER_CALL):
        hi = min(lo + RESULTS_PER_CALL, count)
        first = opening + 1 if lo == 0 else int(seps[lo - 1]) + 1
        batch = b"[" + array[first : int(seps[hi - 1])] + b"]"
        try:
            packed.add(_RESULTS_DECODER.decode(batch))
        except msgspec.ValidationError as exc:
            return None, _problem(exc, lo)
    del head, array
    return FastObserve(head_fields[0], head_fields[1], head_fields[2], packed.done(), head_fields[3]), ""


class ResultRow(NamedTuple):
    """One result of PackedResults, as the contract's Result reads it."""

    prompt_id: int
    rewards: list[float] | None
    successes: float | None
    trials: int | None


class PackedResults:
    """An observe body's results as arrays, as decode_observe hands them on (a list of objects per
    result would keep hundreds of thousands of objects alive for the garbage collector to walk, with the
    event loop's thread waiting). Row i: prompt `ids[i]`; its rewards `values[offsets[i]:offsets[i+1]]`
    when `has_rewards[i]` (an empty slice is an empty list), else none; `successes[i]` and `trials[i]`,
    NaN when not given. Indexing gives ResultRow (tests, error paths); payloads.outcome_payload reads
    the arrays."""

    __slots__ = ("has_rewards", "ids", "offsets", "successes", "trials", "values")

    def __init__(
        self,
        ids: np.ndarray,
        has_rewards: np.ndarray,
        offsets: np.ndarray,
        values: np.ndarray,
        successes: np.ndarray,
        trials: np.ndarray,
    ) -> None:
        self.ids, self.has_rewards, self.offsets = ids, has_rewards, offsets
        self.values, self.successes, self.trials = values, successes, trials

    @classmethod
    def of(cls, results: Sequence[Any]) -> PackedResults:
        """The results of a body the contract's models decoded (or any objects with their attributes),
        packed as the fast twin packs its own."""
        packer = _Packer(len(results))
        packer.add(results)
        return packer.done()

    def __len__(self) -> int:
        return int(self.ids.size)

    def __getitem__(self, i: int) -> ResultRow:
        rewards = self.values[self.offsets[i] : self.offsets[i + 1]].tolist() if self.has_rewards[i] else None
        s, t = self.successes[i], self.trials[i]
        return ResultRow(
            int(self.ids[i]), rewards, None if np.isnan(s) else float(s), None if np.isnan(t) else int(t)
        )

    def __iter__(self) -> Iterator[ResultRow]:
        return (self[i] for i in range(len(self)))


class _Packer:
    """Builds PackedResults batch by batch (each batch's structs are dropped once copied)."""

    def __init__(self, n: int) -> None:
        self.ids = np.empty(n, dtype=np.int64)
        self.has = np.zeros(n, dtype=bool)
        self.lengths = np.zeros(n, dtype=np.int64)
        self.succ = np.full(n, np.nan)
        self.trials = np.full(n, np.nan)
        self.values: list[np.ndarray] = []
        self.at = 0

    def add(self, batch: Sequence[Any]) -> None:
        lo, flat = self.at, []
        nan = math.nan
        ids, has, lengths, succ, trials = [], [], [], [], []
        for r in batch:
            ids.append(r.prompt_id)
            rewards = r.rewards
            if rewards is None:
                has.append(False)
                lengths.append(0)
            else:
                has.append(True)
                lengths.append(len(rewards))
                flat += rewards
            succ.append(nan if r.successes is None else r.successes)
            trials.append(nan if r.trials is None else r.trials)
        hi = lo + len(batch)
        self.ids[lo:hi], self.has[lo:hi], self.lengths[lo:hi] = ids, has, lengths
        self.succ[lo:hi], self.trials[lo:hi] = succ, trials
        self.values.append(np.asarray(flat, dtype=np.float64))
        self.at = hi

    def done(self) -> PackedResults:
        offsets = np.zeros(self.ids.size + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=offsets[1:])
        values = np.concatenate(self.values) if self.values else np.empty(0)
        return PackedResults(self.ids, self.has, offsets, values, self.succ, self.trials)
