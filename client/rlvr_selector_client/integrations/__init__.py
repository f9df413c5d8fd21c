"""Adapters that let trainers people already use ask the selector service which prompts to train on.

- `rlvr_selector_client.integrations.verl` (+ `verl_main` for verl >= 0.8, `verl_v1` for verl 0.9's v1
  trainer): a curriculum sampler for verl's PPO/GRPO trainers, and for v1 a replay buffer that reports
  each group as it finishes.
- `rlvr_selector_client.integrations.trl`: a `RepeatSampler`-shaped sampler, a reward-function wrapper and a
  `GRPOTrainer` subclass for TRL.
- `rlvr_selector_client.integrations.areal`: a sampler, dataset and workflow wrapper for AReaL's asynchronous
  rollout.
- `rlvr_selector_client.integrations.openrlhf`: OpenRLHF's ``train_ppo_ray`` entry point with the prompt
  loader and rollout collection of the selector.
- `rlvr_selector_client.integrations.slime`: a data source and rollout hook for slime.
- `rlvr_selector_client.integrations.tinker`: a dataset (and its ``chz`` builder) for the Tinker cookbook's
  RL loop, selecting each step when its first group starts and reporting each group once graded.
- `rlvr_selector_client.integrations.skyrl`: SkyRL's PPO trainer with the selector's train dataloader and a
  report of every step's rollouts.

All speak to the service only through `rlvr_selector_client.client.SelectorClient`, take their settings as one
`SelectorOptions`, and follow the same rules as our own loop: a service prompt id is a stable integer per
prompt (a dataset column, never a row position that filtering can shift), each training step selects
once, and every group of rollouts is reported to ``/observe`` with a request id (`request_id`) that
makes a retried report count once.

What every adapter does the same way lives here: the options (`SelectorOptions`), creating the service
dataset (`ensure_dataset`), grouping rewards (`group_results`), handing out a selected step's rows one at
a time with a checkpointable position (`StepIterator` over a `StepSampler`), request ids
(`request_id`, `new_run_id`), the installed framework's version (`framework_version`), and reporting a
group so that it counts exactly once while the service is away (`observe_exactly_once`, and
`observe_exactly_once_async` for an `AsyncSelectorClient`): every adapter's ``/observe`` goes through it.

This package imports no trainer framework; each submodule imports its framework when it is imported.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import InitVar, dataclass, field, fields
from typing import Any, NamedTuple

from rlvr_selector_client import contract
from rlvr_selector_client.client import (
    AsyncSelectorClient,
    DatasetInfo,
    NotFound,
    ObserveAck,
    Result,
    RolloutBudget,
    Selection,
    SelectorClient,
    ServiceUnavailable,
    first_step,
)
from rlvr_selector_client.contract import DEFAULTS as DATASET_DEFAULTS

__all__ = [
    "SelectedStep",
    "SelectorOptions",
    "StepIterator",
    "StepSampler",
    "check_permutation",
    "ensure_dataset",
    "first_step",
    "framework_version",
    "group_results",
    "new_run_id",
    "observe_exactly_once",
    "observe_exactly_once_async",
    "open_dataset",
    "request_id",
]

logger = logging.getLogger(__name__)

#: A PEP 440 version's release segment, after an optional epoch: ``1!2.3.4rc1+local`` -> ``2.3.4``.
_RELEASE = re.compile(r"\s*v?(?:\d+!)?(\d+(?:\.\d+)*)")

#: Environment variables `SelectorOptions` reads for a setting that is not given (explicit values win),
#: in every adapter alike: whether the options come from a config section (`SelectorOptions.resolve`) or
#: are built in Python (``SelectorOptions(...)``).
ENV = {
    "url": "SELECTOR_URL",
    "dataset": "SELECTOR_DATASET",
    "strategy": "SELECTOR_STRATEGY",
    "seed": "SELECTOR_SEED",
    "token": "SELECTOR_API_TOKEN",
    "max_lag": "SELECTOR_MAX_LAG",
}

#: The strategy an adapter runs when none is given: the decision table's row for a run that knows
#: nothing per prompt, whatever its shape (rlvr_selector_client.recommend.RULES; docs/strategies.md,
#: "What to run"). An adapter uploads no pass rates; with rates, name the strategy the table gives.
DEFAULT_STRATEGY = "uniform"


@dataclass
class SelectorOptions:
    """Where the service is, which dataset and strategy, and how the dataset is created if missing.

    A setting left out (None, or ``""`` for ``dataset``) is read from its environment variable (`ENV`:
    ``SELECTOR_URL``, ``SELECTOR_DATASET``, ``SELECTOR_STRATEGY``, ``SELECTOR_SEED``,
    ``SELECTOR_API_TOKEN``, ``SELECTOR_MAX_LAG``), from ``os.environ`` or the ``environ`` given; then
    ``strategy`` defaults to `DEFAULT_STRATEGY` (uniform, the decision table's choice when nothing is
    known per prompt) and ``seed`` to 0. ``url`` and ``dataset`` are required (or
    ``client`` instead of ``url``).

    ``filter`` is a select's filter object (``{}`` for the service's defaults; docs/api.md, "Select with a
    filter"): every batch leaves out the prompts almost surely solved or hopeless. None: no filter.

    ``client`` is an already built `SelectorClient` (then ``url``/``token``/``timeout``/``retries`` are
    not used). ``rollouts_per_prompt`` and ``max_lag`` are None to take them from the trainer's own
    config where the adapter can (group size; staleness of asynchronous rollout). ``reward_key`` names
    the trainer field whose value is reported (None: the adapter's default). ``id_column`` is the
    dataset column holding the service prompt id (verl reads ``extra_info.index`` instead).

    ``rollout_budget`` asks the service to share that many rollouts per step over the step's prompts
    (docs/api.md, "Select with a rollout budget"), each prompt between ``rollout_min`` and
    ``rollout_max`` (None: the service's limit), by ``rollout_policy``; `rollouts` is what an adapter
    passes to ``select`` (None without a budget: every prompt gets the trainer's own group size). An
    adapter that cannot give prompts their own counts refuses a budget (`connect`).
    """

    url: str | None = None
    dataset: str = ""
    strategy: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    filter: dict[str, Any] | None = None
    seed: int | None = None
    token: str | None = None
    timeout: float = 30.0
    retries: int = 5
    client: SelectorClient | None = field(default=None, repr=False, compare=False)
    id_column: str = "prompt_id"
    run_id: str | None = None
    create: bool = True
    rollouts_per_prompt: int | None = None
    max_lag: int | None = None
    success_threshold: float = DATASET_DEFAULTS["success_threshold"]
    beta_decay: float = DATASET_DEFAULTS["beta_decay"]
    hmm_decay: float = DATASET_DEFAULTS["hmm_decay"]
    reward_key: str | None = None
    rollout_budget: int | None = None
    rollout_min: int = 1
    rollout_max: int | None = None
    rollout_policy: str = contract.DEFAULT_ROLLOUT_POLICY
    environ: InitVar[Mapping[str, str] | None] = None

    def __post_init__(self, environ: Mapping[str, str] | None) -> None:
        env = os.environ if environ is None else environ
        for key, variable in ENV.items():
            if getattr(self, key) in (None, "") and env.get(variable):
                setattr(self, key, env[variable])
        if not self.dataset:
            raise ValueError(
                "SelectorOptions needs the service dataset name (dataset=..., or env SELECTOR_DATASET)"
            )
        if not self.url and self.client is None:
            raise ValueError(
                "SelectorOptions needs the service url (url=..., or env SELECTOR_URL) or a client"
            )
        self.strategy = self.strategy or DEFAULT_STRATEGY
        self.seed = int(self.seed or 0)
        if self.max_lag is not None:
            self.max_lag = int(self.max_lag)
            if self.max_lag < 0:
                raise ValueError(f"max_lag={self.max_lag}: it counts steps, 0 or more")
        self.params = dict(self.params or {})
        if self.filter is not None and not isinstance(self.filter, Mapping):
            raise ValueError(
                f"filter={self.filter!r}: a mapping of the filter's settings, {{}} for the defaults"
            )
        self.filter = None if self.filter is None else dict(self.filter)
        if self.rollout_budget is not None:
            self.rollout_budget = int(self.rollout_budget)
            self.rollout_min = int(self.rollout_min)
            self.rollout_max = None if self.rollout_max is None else int(self.rollout_max)
            broken = contract.rollout_problems(self.rollout_budget, self.rollout_min, self.rollout_max)
            if self.rollout_budget < 1 or "min" in broken:
                raise ValueError("rollout_budget and rollout_min must be positive integers")
            if "order" in broken:
                raise ValueError(f"rollout_max={self.rollout_max} is below rollout_min={self.rollout_min}")

    def rollouts(self) -> RolloutBudget | None:
        """The rollout budget a select asks for, or None (every prompt gets the trainer's group size)."""
        if self.rollout_budget is None:
            return None
        return RolloutBudget(self.rollout_budget, self.rollout_min, self.rollout_max, self.rollout_policy)

    def refuse_rollout_budget(self, why: str) -> None:
        """For adapters whose trainer gives every prompt the same group size: refuse a budget."""
        if self.rollout_budget is not None:
            raise ValueError(f"rollout_budget={self.rollout_budget} is not supported here: {why}")

    @classmethod
    def resolve(
        cls, values: Mapping[str, Any] | None, environ: Mapping[str, str], where: str = "selector"
    ) -> SelectorOptions:
        """Options from a config section (``where`` names it in errors) with the ``SELECTOR_*``
        environment variables of ``environ`` filling what the section leaves out (the section wins), as
        the constructor does with ``os.environ``."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)} - {"client"}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown key(s) {sorted(unknown)} under {where}; known: {sorted(known)}")
        missing = [key for key in ("url", "dataset") if not values.get(key) and not environ.get(ENV[key])]
        if missing:
            raise ValueError(
                "the selector needs " + " and ".join(f"{where}.{key} (or env {ENV[key]})" for key in missing)
            )
        return cls(**values, environ=environ)

    def connect(self, *, per_prompt_rollouts: bool = False) -> SelectorClient:
        """The client to use: the given one, or a new one for ``url``.

        An adapter whose trainer can roll out each prompt by its own count says so with
        ``per_prompt_rollouts=True``; the others refuse a ``rollout_budget`` here, so that no adapter
        ignores one silently."""
        if not per_prompt_rollouts:
            self.refuse_rollout_budget(
                "this trainer rolls out the same number of completions for every prompt; per-prompt counts "
                "are supported with verl 0.9's v1 trainer and the Tinker cookbook"
            )
        if self.client is not None:
            return self.client
        assert self.url is not None  # __post_init__
        return SelectorClient(self.url, token=self.token, timeout=self.timeout, retries=self.retries)


def open_dataset(
    client: SelectorClient,
    options: SelectorOptions,
    size: int,
    group_size: int | None,
    *,
    max_lag: int = 0,
    what: str = "the train dataset",
    group_option: str = "the trainer's group size",
) -> DatasetInfo:
    """The service dataset this run trains on: created when it is missing (and ``options.create``), and
    checked against the trainer's data and group size.

    ``group_size`` is how many completions the trainer rolls out per prompt (``group_option`` names
    that setting in messages), None where the adapter cannot know it or the groups have their own sizes
    (a rollout budget). A new dataset gets ``rollouts_per_prompt`` = ``group_size`` (else
    ``options.rollouts_per_prompt``, else the service's default). Refused with what to do: a group size
    that differs from ``options.rollouts_per_prompt`` or from an existing dataset's (INSIGHT would score
    for groups of the dataset's size; a ``k`` in ``options.params`` overrides that and is accepted), and
    a dataset of another size.

    A 404 for the dataset is taken as "missing" only once the service's root answers as the selector
    (`SelectorClient.check_url`): a base URL with a wrong path answers every path with 404, and is named
    as such instead of leading to a create that fails.

    ``max_lag`` is how many steps late this trainer may report; a dataset created here accepts that,
    and an existing one that accepts less is warned about (reports of a trainer that gives their
    ``selected_step`` are then filed at the open step; the others are refused)."""
    declared = options.rollouts_per_prompt
    budget = options.rollout_budget is not None
    if declared is not None and group_size is not None and declared != group_size and not budget:
        raise ValueError(
            f"rollouts_per_prompt={declared} in the selector options but {group_option} is {group_size}: the "
            f"trainer rolls out {group_size} completions per prompt. Leave rollouts_per_prompt unset (the "
            f"adapter takes {group_option}) or make the two equal"
        )
    known = group_size if group_size is not None else declared
    rollouts = known if known is not None else DATASET_DEFAULTS["rollouts_per_prompt"]
    try:
        info = client.get_dataset(options.dataset)
    except NotFound:
        client.check_url()
        if not options.create:
            raise ValueError(
                f"dataset {options.dataset!r} does not exist in the selector service at {client.base_url}; "
                f"create it with size {size} or let the adapter create it (create=True)"
            ) from None
        client.create_dataset(
            options.dataset,
            size,
            rollouts_per_prompt=rollouts,
            success_threshold=options.success_threshold,
            beta_decay=options.beta_decay,
            hmm_decay=options.hmm_decay,
            max_lag=max_lag,
        )
        info = client.get_dataset(options.dataset)
    if info.size != size:
        raise ValueError(
            f"dataset {options.dataset!r} in the selector service has {info.size} prompts but {what} has "
            f"{size} rows; use another dataset name or the matching data"
        )
    if known is not None and info.rollouts_per_prompt != known and not budget and "k" not in options.params:
        raise ValueError(
            f"dataset {options.dataset!r} in the selector service was created with rollouts_per_prompt="
            f"{info.rollouts_per_prompt}, but {group_option} is {known}: INSIGHT would score prompts for groups "
            f"of {info.rollouts_per_prompt}. Set {group_option} to {info.rollouts_per_prompt}, or use a new "
            f"dataset name (the adapter creates it with {known})"
        )
    if info.max_lag < max_lag:
        logger.warning(
            "dataset %r accepts results up to %d steps late but this trainer may report %d steps late; "
            "later reports are filed at the open step (or refused, for a trainer that does not say which "
            "step it selected them at)",
            options.dataset,
            info.max_lag,
            max_lag,
        )
    return info


def ensure_dataset(
    client: SelectorClient,
    options: SelectorOptions,
    size: int,
    group_size: int | None,
    *,
    max_lag: int = 0,
    what: str = "the train dataset",
    group_option: str = "the trainer's group size",
) -> int:
    """`open_dataset`, and the step this run starts at (`first_step`: after any earlier run's)."""
    return first_step(
        open_dataset(client, options, size, group_size, max_lag=max_lag, what=what, group_option=group_option)
    )


def check_group_sizes(results: Iterable[Result], expected: int, where: str) -> None:
    """Refuse a report whose groups are not ``expected`` rollouts each (the dataset's
    ``rollouts_per_prompt``), for adapters that learn the trainer's group size only from its first
    report; ``where`` says which setting to change."""
    sizes = sorted({len(r.rewards or []) for r in results})
    if sizes and sizes != [expected]:
        raise ValueError(
            f"the trainer rolled out groups of {', '.join(map(str, sizes))} completions but the selector's "
            f"dataset has rollouts_per_prompt={expected}: {where}"
        )


def group_results(prompt_ids: Iterable[int], rewards: Iterable[float]) -> list[Result]:
    """One `Result` per distinct prompt id with that prompt's rewards in order of appearance.

    Raises ValueError when the two sequences differ in length or a reward is not a finite number,
    because the service would reject the whole report and the error is clearer here.
    """
    ids = [int(i) for i in prompt_ids]
    values = [float(r) for r in rewards]
    if len(ids) != len(values):
        raise ValueError(f"{len(ids)} prompt ids but {len(values)} rewards; report one reward per completion")
    grouped: dict[int, list[float]] = {}
    for prompt_id, reward in zip(ids, values, strict=True):
        if reward != reward or reward in (float("inf"), float("-inf")):
            raise ValueError(
                f"reward {reward} for prompt {prompt_id} is not finite; verifiers must return numbers"
            )
        grouped.setdefault(prompt_id, []).append(reward)
    return [Result(prompt_id=pid, rewards=group) for pid, group in grouped.items()]


def new_run_id(given: str | None, prefix: str) -> str:
    """The run id reports are filed under: the one given, else ``{prefix}-`` and ten random hex digits.

    A sampler keeps it in its checkpoint (`StepSampler.state_dict`), so a resumed run resends its
    reports under the same request ids."""
    return given or f"{prefix}-{uuid.uuid4().hex[:10]}"


def request_id(
    run_id: str,
    step: int,
    *,
    sequence: int | None = None,
    rank: int | None = None,
    prompt: int | None = None,
    prompts: Collection[int] | None = None,
    round_index: int | None = None,
) -> str:
    """The request id of one ``/observe`` report: the service applies a request id once, so a retried
    or resent report (the same id, the same body) counts once, and every distinct report needs its own.

    ``{run_id}[-g{sequence}]-s{step}[-r{rank}][-p{prompt}|-{digest}][-d{round_index}]``, each part only
    when given: ``sequence`` numbers the reports of trainers whose reports are not told apart by their
    step (TRL files a generation under the latest selected step); ``rank`` is the reporting process
    when each rank reports its own share; ``prompt`` is the one prompt of a report of one group;
    ``prompts`` are the prompts of a report that covers some of the step's, named by a digest of the
    sorted distinct ids (the same prompts in any order give the same id, one prompt included);
    ``round_index`` is the round of a step
    that reports several rounds (dynamic sampling). Ids are deterministic in these values, which is
    what lets a resumed run resend a report as a duplicate."""
    parts = [run_id]
    if sequence is not None:
        parts.append(f"g{sequence}")
    parts.append(f"s{step}")
    if rank is not None:
        parts.append(f"r{rank}")
    if prompt is not None:
        parts.append(f"p{int(prompt)}")
    elif prompts is not None:
        distinct = sorted({int(p) for p in prompts})
        parts.append(uuid.uuid5(uuid.NAMESPACE_OID, ",".join(map(str, distinct))).hex[:12])
    if round_index is not None:
        parts.append(f"d{round_index}")
    return "-".join(parts)


#: How long `observe_exactly_once` keeps sending one report again while the service is away, in seconds.
RESEND_PATIENCE_S = 600.0
#: Its waits between sends, in seconds: the first, doubling up to the second.
RESEND_WAITS_S = (1.0, 30.0)


def observe_exactly_once(
    client: SelectorClient,
    dataset: str,
    step: int,
    results: Sequence[Result],
    request_id: str,
    *,
    selected_step: int | None = None,
    patience_s: float = RESEND_PATIENCE_S,
    waits_s: tuple[float, float] = RESEND_WAITS_S,
) -> ObserveAck:
    """``client.observe(...)``, sent again with the same request id and results while the service is away,
    so that the report counts exactly once: how every adapter reports, and the loop a trainer of its own
    runs (docs/operations.md, "Errors and what to do").

    `OutcomeUnknown` (the report may have been applied) and `ServiceUnavailable` (it was not) are logged
    and the same report sent again, after waits doubling from 1 s to 30 s (``waits_s``), for up to
    ``patience_s`` seconds. The service applies a request id at most once, and the client answers a
    report whose earlier send got no answer with what that send applied (``applied: n, duplicate:
    false``), so ``ack.applied`` counts the results of a report made once and ``ack.duplicate`` is
    True only for a report that was acknowledged before (a resumed run's). Once ``patience_s`` is spent
    the last error is raised (`OutcomeUnknown` when a send may have been applied: the run can still
    send it again later under the same request id). Every other error (a 409 for a step closed beyond
    max_lag, say) is raised at once: sending again cannot help."""
    started, wait = time.monotonic(), waits_s[0]
    late = {} if selected_step is None else {"selected_step": selected_step}  # as the adapter called it
    while True:
        try:
            return client.observe(dataset, step, results, request_id=request_id, **late)
        except ServiceUnavailable as exc:
            _resend_or_raise(exc, request_id, started, wait, patience_s)
        time.sleep(wait)
        wait = min(wait * 2, waits_s[1])


async def observe_exactly_once_async(
    client: AsyncSelectorClient,
    dataset: str,
    step: int,
    results: Sequence[Result],
    request_id: str,
    *,
    selected_step: int | None = None,
    patience_s: float = RESEND_PATIENCE_S,
    waits_s: tuple[float, float] = RESEND_WAITS_S,
) -> ObserveAck:
    """`observe_exactly_once` for an `AsyncSelectorClient`."""
    import asyncio

    started, wait = time.monotonic(), waits_s[0]
    late = {} if selected_step is None else {"selected_step": selected_step}
    while True:
        try:
            return await client.observe(dataset, step, results, request_id=request_id, **late)
        except ServiceUnavailable as exc:
            _resend_or_raise(exc, request_id, started, wait, patience_s)
        await asyncio.sleep(wait)
        wait = min(wait * 2, waits_s[1])


def _resend_or_raise(
    error: ServiceUnavailable, request_id: str, started: float, wait: float, patience_s: float
) -> None:
    """Raises ``error`` once a wait of ``wait`` seconds would pass ``patience_s``, else logs the resend."""
    spent = time.monotonic() - started
    if spent + wait > patience_s:
        raise error
    logger.warning(
        "the selector did not acknowledge report %r; sending it again with the same request id in %.1f s "
        "(%.0f of %.0f s of patience spent): %s",
        request_id,
        wait,
        spent,
        patience_s,
        error,
    )


def one_group(run_id: str, step: int, prompt_id: int, rewards: list[float]) -> tuple[list[Result], str]:
    """The report of one prompt's group, made by adapters that report each group as it finishes: its
    results and its request id (`request_id` with the one prompt)."""
    return [Result(prompt_id=prompt_id, rewards=rewards)], request_id(run_id, step, prompt=prompt_id)


def framework_version(package: str) -> tuple[int, int] | None:
    """(major, minor) of an installed package (a trainer framework), or None when it is not installed.

    The release numbers that open a version string (PEP 440, after any ``N!`` epoch), so pre-releases
    and local builds such as ``0.9.0rc1`` or ``0.8.0+cu124`` count as their release."""
    from importlib import metadata

    try:
        installed = metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
    release = _RELEASE.match(installed)
    if release is None:
        raise ValueError(
            f"{package} reports version {installed!r}, which does not start with a release number"
        )
    major, minor, *_ = (*map(int, release.group(1).split(".")), 0)
    return major, minor


def log_too_late(prompt_id: int, step: int, detail: str, remedy: str) -> None:
    """Logs a group the service refused as older than the dataset's max_lag (409), with what to change."""
    logger.error(
        "the selector refused the rewards of prompt %d at step %d as too late (%s); %s",
        prompt_id,
        step,
        detail,
        remedy,
    )


def check_permutation(ids: Sequence[int], where: str) -> dict[int, int]:
    """Map prompt id -> row for a dataset whose id column must be a permutation of ``0..len-1``.

    The service's prompt ids are ``0..size-1``; a dataset whose ids skip values (rows filtered after
    the ids were assigned) or repeat would make the service pick prompts that do not exist.
    """
    rows: dict[int, int] = {}
    size = len(ids)
    for row, raw in enumerate(ids):
        if raw is None or isinstance(raw, bool) or int(raw) != raw:
            raise ValueError(f"{where}: row {row} has prompt id {raw!r}; every row needs an integer id")
        prompt_id = int(raw)
        if not 0 <= prompt_id < size:
            raise ValueError(
                f"{where}: row {row} has prompt id {prompt_id}, outside 0..{size - 1}; ids must be "
                "0..len(dataset)-1 (renumber them after filtering the dataset)"
            )
        if prompt_id in rows:
            raise ValueError(f"{where}: prompt id {prompt_id} appears in rows {rows[prompt_id]} and {row}")
        rows[prompt_id] = row
    return rows


class SelectedStep(NamedTuple):
    """One selected step as a sampler hands it out: its number, the items it yields in order (dataset
    rows, or whatever the sampler's loader decodes), and each item's rollout count (None: every prompt
    gets the trainer's own group size)."""

    step: int
    items: list[int]
    counts: list[int] | None = None


class StepSampler:
    """What the adapters' samplers share (mixed into each, beside torch's ``Sampler`` where the trainer
    wants one): the client and options a selection uses, the service step it asks for next, the run id
    reports are filed under, and their checkpoint.

    A sampler sets ``client``, ``options``, ``next_step`` (where the service says this run starts,
    `ensure_dataset`) and ``run_id`` (None when its reports are made elsewhere); one that a loader
    iterates implements `select_step` and returns a `StepIterator` over the epoch's steps from
    ``__iter__``. ``state_dict`` / ``load_state_dict`` are what torchdata's ``StatefulDataLoader``
    saves and restores with the loader."""

    client: SelectorClient
    options: SelectorOptions
    next_step: int
    run_id: str | None = None

    def select(self, count: int, rollouts: RolloutBudget | None = None) -> tuple[int, Selection]:
        """``/select`` of ``count`` prompts at ``next_step`` with the options' strategy, params and seed;
        moves ``next_step`` on and returns the step selected with the answer."""
        step = self.next_step
        o = self.options
        selection = self.client.select(
            o.dataset, step, count, o.strategy, o.params or None, o.seed, rollouts=rollouts, filter=o.filter
        )
        self.next_step = step + 1
        return step, selection

    def select_step(self) -> SelectedStep:
        """Select ``next_step`` (and advance it); what to hand out."""
        raise NotImplementedError

    def handed_out(self, step: int, item: int, count: int | None) -> None:
        """Called with every item as the loader takes it (for samplers that remember what is in flight)."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"next_step": self.next_step}
        if self.run_id is not None:
            state["run_id"] = self.run_id
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: never go back to a step the service has already moved past, and file reports under
        the checkpoint's run id (a report the crashed run sent already is then a duplicate)."""
        self.next_step = max(int(state["next_step"]), self.next_step)
        if state.get("run_id"):
            self.run_id = str(state["run_id"])


class StepIterator(Iterator[int]):
    """One epoch of a `StepSampler`: ``steps`` service steps, each selected when its first item is
    needed (not before: the previous step's rewards may still change the service's choice), its items
    handed out one at a time.

    It has ``state_dict`` / ``load_state_dict`` so that ``StatefulDataLoader`` checkpoints the position
    instead of fast-forwarding on resume (which would select, and close, extra steps). A checkpoint
    taken in the middle of a step resumes at the next step: the run that crashed after it may have
    rolled out and reported the rest of that step already, so those items are dropped, not rolled out
    twice."""

    def __init__(self, owner: StepSampler, steps: int) -> None:
        self.owner = owner
        self.steps_left = steps
        self.step: int | None = None
        self.rows: list[int] = []
        self.counts: list[int] | None = None
        self.position = 0

    def __next__(self) -> int:
        if self.position == len(self.rows):
            if self.steps_left == 0:
                raise StopIteration
            self.step, self.rows, self.counts = self.owner.select_step()
            self.position = 0
            self.steps_left -= 1
        item = self.rows[self.position]
        count = None if self.counts is None else self.counts[self.position]
        self.position += 1
        assert self.step is not None
        self.owner.handed_out(self.step, item, count)
        return item

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps_left": self.steps_left,
            "step": self.step,
            "rows": list(self.rows),
            "counts": None if self.counts is None else list(self.counts),
            "position": self.position,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps_left = int(state["steps_left"])
        self.step = None if state.get("step") is None else int(state["step"])
        # AReaL's sampler once saved its items as "codes".
        self.rows = [int(r) for r in state.get("rows", state.get("codes", []))]
        counts = state.get("counts")
        self.counts = None if counts is None else [int(c) for c in counts]
        self.position = int(state["position"])
        if self.position < len(self.rows):
            logger.info(
                "resuming in the middle of service step %s: its %d items not yet handed out at the "
                "checkpoint are dropped",
                self.step,
                len(self.rows) - self.position,
            )
            self.position = len(self.rows)
