"""The service's side of the dataset settings, whose one declaration is the client package's
(rlvr_selector_client/contract.py, `DatasetSettings`, read as `SETTINGS`).

From the declaration follow: the create and info bodies (`create_fields`, `info_fields`, built into
schemas.DatasetCreate and DatasetInfo); the stored spec (state.DatasetSpec is DatasetSettings with the
incarnation's uid: `from_doc` reads a stored document, `from_request` a create body, `problems` checks
one); and the constants the kernels read (`RULES`: the settings that core.shared.DatasetRules holds
under the same names). The bounds that are the kernels' numerically safe domain stay the service's: the
declaration names them, and core/domain.py reads them (`resolved` for the bodies, `problems` for a
spec).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from rlvr_selector_client.contract import (
    DEFAULTS,
    INFO_DEFAULTED,
    NAME,
    REQUIRED,
    SETTINGS,
    DatasetSettings,
    Setting,
    from_doc,
)
from selector_service.core import domain
from selector_service.core.shared import DatasetRules

__all__ = [
    "DEFAULTS",
    "INFO_DEFAULTED",
    "NAME",
    "REQUIRED",
    "RULES",
    "SETTINGS",
    "DatasetSettings",
    "Resolved",
    "Setting",
    "create_fields",
    "from_doc",
    "from_request",
    "info_fields",
    "problems",
    "resolved",
]

#: The settings the kernels read, in the declaration's order: DatasetRules fields of the same name
#: (state.DatasetSpec.rules hands them on; the Beta prior reaches the rules as alpha0, beta0).
RULES: tuple[str, ...] = tuple(
    s.name for s in SETTINGS if s.name in {f.name for f in dataclasses.fields(DatasetRules)}
)

#: What is out of range in a spec's settings (the same domain as the create body's), or None.
problems = domain.settings_problems


@dataclass(frozen=True)
class Resolved:
    """A setting with its named bounds read from core/domain.py."""

    setting: Setting
    description: str
    constraints: dict[str, Any]
    check: Callable[[Any], str | None] | None


@cache
def resolved() -> tuple[Resolved, ...]:
    """Every setting with its bounds, description and check resolved (core/domain.py)."""
    return tuple(
        Resolved(
            s,
            s.description(domain) if callable(s.description) else s.description,
            domain.bounds(s),
            domain.setting_check(s),
        )
        for s in SETTINGS
    )


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


def from_request(request: Any) -> dict[str, Any]:
    """The settings of a create body (schemas.DatasetCreate), as the spec holds them."""
    return {s.name: s.to_stored(getattr(request, s.name)) for s in SETTINGS}
