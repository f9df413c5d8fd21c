"""Selection: which prompts a step trains on (select), what the rollouts showed (observe), and the
strategies' scores of any prompts (score)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Header, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from rlvr_selector_client import contract
from selector_service.api.deps import EngineDep, SettingsDep, require_token
from selector_service.api.errors import ERRORS
from selector_service.api.openapi import json_body
from selector_service.contract.schemas import (
    ObserveRequest,
    ObserveResponse,
    RolloutPolicyInfo,
    ScoreRequest,
    ScoreResponse,
    SelectRequest,
    SelectResponse,
    StrategiesResponse,
    StrategyInfo,
    StrategyParamInfo,
    decode_observe,
)
from selector_service.core.rollouts import DEFAULT_ROLLOUT_POLICY, ROLLOUT_POLICY_HELP
from selector_service.core.strategies import FILTER_PARAMS, STRATEGIES
from selector_service.errors import InvalidRequest, PayloadTooLarge

router = APIRouter(dependencies=[Depends(require_token)], responses=ERRORS, tags=["selection"])
#: Observe bodies above this size are parsed in a worker thread (a few hundred results parse in well
#: under a millisecond: the thread hop would cost more).
INLINE_PARSE_BYTES = 64 * 1024
#: A refused observe body up to this size is explained by pydantic (ObserveRequest's messages).
EXPLAIN_BYTES = 1 << 20


@router.post(
    "/select",
    response_model=SelectResponse,
    response_model_exclude_unset=True,  # `rollouts` only when asked: other answers stay as they were
    summary="Select a batch of prompts",
    operation_id="select",
)
async def select(body: SelectRequest, engine: EngineDep, settings: SettingsDep) -> SelectResponse:
    """The `batch_size` distinct prompts the strategy picks for training step `step`, from the beliefs
    after every observation of earlier steps (docs/methods.md describes the strategies). With
    `rollouts`, also how many rollouts each of them gets (docs/methods.md §8); with `filter`, none of the
    prompts almost surely solved or hopeless (docs/methods.md §9).

    A step later than the open one first closes the steps before it; a step already closed is a 409.
    The same dataset, step, strategy, params, seed and batch_size (and rollouts) with no observation of
    that step in between give the same prompt_ids (and counts), on every replica.
    """
    if body.batch_size > settings.max_batch_size:
        raise PayloadTooLarge(
            f"batch_size {body.batch_size} is over this service's limit of {settings.max_batch_size}"
        )
    ids, scores, step, rollouts = await engine.select(
        body.dataset,
        step=body.step,
        batch_size=body.batch_size,
        strategy=body.strategy,
        params=body.params or {},
        seed=body.seed,
        rollouts=body.rollouts,
        filter=None if body.filter is None else body.filter.model_dump(),
    )
    extra = {} if rollouts is None else {"rollouts": rollouts.tolist()}
    return SelectResponse(
        dataset=body.dataset,
        step=step,
        strategy=body.strategy,
        prompt_ids=ids.tolist(),
        scores=scores.tolist() if body.return_scores and scores is not None else None,
        **extra,
    )


@router.post(
    "/observe",
    response_model=ObserveResponse,
    openapi_extra=json_body(ObserveRequest),
    summary="Report rollout results",
    operation_id="observe",
)
async def observe(
    request: Request,
    engine: EngineDep,
    call: Annotated[
        str | None,
        Header(
            alias=contract.CALL_HEADER,
            pattern=f"^{contract.CALL_ID}$",
            description="Optional: the client's id of this call, the same on each of its attempts (1 to 64 "
            "letters, digits, '-' or '_'). A request id applied by an attempt with the same call id is "
            "answered with what that attempt applied (`duplicate: false`), not as a duplicate (an extension "
            "of the contract; docs/api.md section 4).",
        ),
    ] = None,
) -> ObserveResponse:
    """Report rollout results for a step; idempotent by request_id, applied whole or not at all."""
    # The hot write path: the bytes are parsed and validated in one pass by ObserveRequest's fast twin
    # (schemas.decode_observe), in a worker thread for large bodies: one C call that holds the GIL for
    # tens of milliseconds at the largest body, where pydantic's held it for seconds and took 36x the
    # body in memory. A body the twin refuses is explained in ObserveRequest's own words when it is
    # small enough for pydantic to read quickly, else in the twin's.
    raw = await request.body()
    if len(raw) > INLINE_PARSE_BYTES:
        body, problem = await asyncio.to_thread(decode_observe, raw)
    else:
        body, problem = decode_observe(raw)
    if body is None:
        if len(raw) > EXPLAIN_BYTES:
            raise InvalidRequest(problem)
        try:  # says why in the contract's words (and, should the twins ever disagree, is the contract)
            body = ObserveRequest.model_validate_json(raw)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None
    del raw
    applied, duplicate, lag = await engine.observe(
        body.dataset,
        step=body.step,
        request_id=body.request_id,
        results=body.results,
        selected_step=body.selected_step,
        call=call,
    )
    return ObserveResponse(applied=applied, duplicate=duplicate, lag=lag)


@router.get(
    "/strategies",
    response_model=StrategiesResponse,
    summary="List the strategies",
    operation_id="listStrategies",
)
async def strategies() -> StrategiesResponse:
    """Every strategy `/select` accepts, with its parameters, their defaults and what each does (the
    accepted range of each: docs/numerics.md), the policies a rollout budget may name and the settings of
    a select's filter. A client can
    check a strategy and its parameter names here before it creates anything."""
    return StrategiesResponse(
        strategies=[
            StrategyInfo(
                name=spec.name,
                scored=spec.scored,
                deterministic=spec.deterministic,
                params=[
                    StrategyParamInfo(
                        name=name, default=p.default, help=p.help, dataset_level=p.dataset_level
                    )
                    for name, p in spec.params.items()
                ],
            )
            for spec in STRATEGIES.values()
        ],
        rollout_policies=[
            RolloutPolicyInfo(name=name, default=name == DEFAULT_ROLLOUT_POLICY, help=help_)
            for name, help_ in ROLLOUT_POLICY_HELP.items()
        ],
        filter=[
            StrategyParamInfo(name=name, default=p.default, help=p.help, dataset_level=False)
            for name, p in FILTER_PARAMS.items()
        ],
    )


@router.post("/score", response_model=ScoreResponse, summary="Score prompts", operation_id="score")
async def score(body: ScoreRequest, engine: EngineDep, settings: SettingsDep) -> ScoreResponse:
    """The scores a /select at the open step would give the prompts asked for, in that order. It writes
    nothing. Strategies that walk a permutation have no per-prompt scores (422)."""
    if len(body.prompt_ids) > settings.max_ids_per_request:
        raise PayloadTooLarge(f"{len(body.prompt_ids)} ids; the limit is {settings.max_ids_per_request}")
    scores, open_step = await engine.score(
        body.dataset,
        strategy=body.strategy,
        params=body.params or {},
        ids=np.asarray(body.prompt_ids, dtype=np.int64),
        seed=body.seed,
    )
    return ScoreResponse(open_step=open_step, scores=scores.tolist())
