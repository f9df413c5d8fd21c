"""The service's side of the dataset settings, whose one declaration is the client package's
(rlvr_selector_client/contract.py, `SETTINGS`).

From the declaration follow: the create and info bodies (`create_fields`, `info_fields`, built into
schemas.DatasetCreate and DatasetInfo) and the stored spec (state.DatasetSpec's fields take their
defaults from `DEFAULTS`, `from_doc` reads a stored document, `from_request` a create body, `problems`
checks one). The bounds that are the kernels'
numerically safe domain stay the service's: the declaration names them, and `resolved` reads them from
core/domain.py when the service first builds its bodies or checks a spec.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from rlvr_selector_client.contract import (
    DEFAULTS,
    INFO_DEFAULTED,
    NAME,
    REQUIRED,
    RULES,
    SETTINGS,
    Setting,
    from_doc,
)

__all__ = [
    "DEFAULTS",
    "INFO_DEFAULTED",
    "NAME",
    "REQUIRED",
    "RULES",
    "SETTINGS",
    "Resolved",
    "Setting",
    "create_fields",
    "from_doc",
    "from_request",
    "info_fields",
    "problems",
    "resolved",
]


@dataclass(frozen=True)
class Resolved:
    """A setting with its named bounds read from core/domain.py."""

    setting: Setting
    description: str
    constraints: dict[str, Any]
    check: Callable[[Any], str | None] | None


@cache
def resolved() -> tuple[Resolved, ...]:
    """Every setting with its bounds, description and check resolved (imports core/domain.py)."""
    from selector_service.core import domain

    out = []
    for s in SETTINGS:
        constraints = {
            k: getattr(domain, v) if isinstance(v, str) and k != "pattern" else v
            for k, v in s.constraints.items()
        }
        description = s.description(domain) if callable(s.description) else s.description
        out.append(Resolved(s, description, constraints, getattr(domain, s.check) if s.check else None))
    return tuple(out)


def _raising(check: Callable[[Any], str | None]) -> Callable[[Any], Any]:
    def validate(value: Any) -> Any:
        problem = check(value)
        if problem:
            raise ValueError(problem)
        return value

    return validate


def create_fields() -> dict[str, Any]:
    """The create body's fields, in order, as pydantic.create_model takes them."""
    fields: dict[str, Any] = {}
    for r in resolved():
        s = r.setting
        kind = Literal[s.choices] if s.choices else s.type
        if r.check is not None:
            kind = Annotated[kind, AfterValidator(_raising(r.check))]
        if s.required:
            info = Field(description=r.description, **r.constraints)
        elif isinstance(s.default, dict):
            info = Field(default_factory=dict, description=r.description, **r.constraints)
        else:
            info = Field(s.default, description=r.description, **r.constraints)
        fields[s.name] = (kind, info)
    return fields


def info_fields() -> dict[str, Any]:
    """The info body's settings fields, in order: each required but those of INFO_DEFAULTED, which the
    schema gives their defaults (every answer holds every setting all the same)."""
    return {s.name: (s.type, s.default if s.name in INFO_DEFAULTED else ...) for s in SETTINGS}


def _problem(r: Resolved, value: Any) -> str | None:
    s, c = r.setting, r.constraints
    if r.check is not None:
        return r.check(value)
    if s.choices:
        return None if value in s.choices else f"{s.name} {value!r} is unknown"
    if isinstance(s.default, dict):
        return None if isinstance(value, dict) else f"{s.name} must be an object"
    low = c.get("gt", c.get("ge"))
    high = c.get("le")
    if s.type is int:
        ok = (low is None or value >= low) and (high is None or value <= high)
        if ok:
            return None
        return (
            f"{s.name} {value} not in {low}..{high}"
            if high is not None
            else f"{s.name} {value} must be >= {low}"
        )
    if s.type is float:
        inside = (
            math.isfinite(value)
            and (low is None or (value > low if "gt" in c else value >= low))
            and (high is None or value <= high)
        )
        if inside:
            return None
        if low is None:
            return f"{s.name} must be finite"
        return f"{s.name} {value} not in {'(' if 'gt' in c else '['}{low:g}, {high:g}]"
    return None


def problems(values: Mapping[str, Any]) -> str | None:
    """What is out of range in a spec's settings (the same domain as the create body's), or None."""
    bad = [p for r in resolved() if (p := _problem(r, values[r.setting.name]))]
    return "; ".join(bad) if bad else None


def from_request(request: Any) -> dict[str, Any]:
    """The settings of a create body (schemas.DatasetCreate), as the spec holds them."""
    return {s.name: s.to_stored(getattr(request, s.name)) for s in SETTINGS}
