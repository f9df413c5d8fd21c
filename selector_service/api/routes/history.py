"""Step history: one row per closed step of a dataset (docs/api.md, "Step history"; selector_service/dataset/history.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from rlvr_selector_client.contract import MAX_STEP
from selector_service.api.deps import DigitsOnly, EngineDep, NamePath, require_token
from selector_service.api.errors import ERRORS
from selector_service.contract.schemas import HistoryResponse

router = APIRouter(dependencies=[Depends(require_token)], responses=ERRORS, tags=["datasets"])

#: The most rows one request returns (about 300 bytes of JSON each).
MAX_LIMIT = 10_000


@router.get(
    "/datasets/{name}/history",
    response_model=HistoryResponse,
    summary="Step history",
    operation_id="getHistory",
)
async def history(
    name: NamePath,
    engine: EngineDep,
    since: Annotated[int, DigitsOnly, Query(ge=0, le=MAX_STEP, description="First step to return.")] = 0,
    limit: Annotated[int, DigitsOnly, Query(ge=1, le=MAX_LIMIT, description="Most rows to return.")] = 1000,
) -> HistoryResponse:
    """One row per closed step from `since` on, oldest first: prompts selected and observed, rollouts,
    shares of all-solved / mixed / none-solved results, mean reward, DPS predicted shares and accuracy,
    late results by lag, select requests by strategy, per-group figures, the running totals of rollouts
    (profiling included). Rows are written when a step
    closes and are the same on every replica; the newest 100,000 steps are kept. Page with
    `since=<next>`."""
    figures = await engine.history(name, since, limit)
    # Validated like the keyword call it stands for: each row's dict becomes a HistoryRow.
    return HistoryResponse.model_validate({"dataset": name, **figures})
