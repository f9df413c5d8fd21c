"""A dataset's settings (POST /datasets, docs/api.md), each declared once in `SETTINGS`.

From the declaration follow: the create and info bodies (`create_fields`, `info_fields`, built into
schemas.DatasetCreate and DatasetInfo); the stored spec (state.DatasetSpec's fields take their
defaults from `DEFAULTS`, `from_doc` reads a stored document, one written before a later setting existed
included, `problems` checks one); and the trainer client's create parameters' defaults, its create
body (`create_body`) and its DatasetInfo.

Standard library and pydantic only: the trainer client imports this module in framework environments
without numpy or numba, so nothing of selector_service.core is imported when it loads. The bounds that
are the kernels' numerically safe domain are named here, not copied: a constraint given as a string
("K_MAX"), a `check` and a description given as a function of the module are core/domain.py's, read
when the service first builds its bodies or checks a spec (`resolved`). The client needs no bound.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

#: A dataset's name (without the anchors of its pattern, which is also how the API describes it).
NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
#: The most steps late an observation may be accepted (max_lag).
MAX_LAG = 1000


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a setting that every request must give (name, size).
REQUIRED: Any = _Required()


def _threshold(value: Any) -> float:
    return float(value) + 0.0  # -0.0 is the same threshold as 0.0


def _pair(value: Any) -> tuple[float, float]:
    return (float(value[0]), float(value[1]))


def _object(value: Any) -> Any:
    """The per-strategy defaults; a stored null is none. Anything else is kept for `problems` to name."""
    return value or {}


@dataclass(frozen=True)
class Setting:
    """One dataset setting.

    `type` is its value's type in the info body (and, but for `choices`, in the create body);
    `constraints` are pydantic Field constraints of the create body (a string value names a constant of
    core/domain.py); `choices` make the create body's type a Literal of them. `stored` turns a request's,
    a stored document's or an answer's value into the spec's (`stored_type`). `check` names a function of
    core/domain.py that says what is wrong with a value (or None), used instead of the constraints'
    own check. `later`: added after the first release, so a stored document or an answer may lack it (it
    then has its default), the spec's fingerprint leaves it out at its default, and the client sends it
    only when it differs from it. `rule`: a field of the same name of core.coldstart.DatasetRules.
    """

    name: str
    type: Any
    default: Any
    description: str | Callable[[Any], str]
    constraints: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    choices: tuple[str, ...] = ()
    stored: Callable[[Any], Any] | None = None
    stored_type: Any = None
    check: str = ""
    later: bool = False
    rule: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def to_stored(self, value: Any) -> Any:
        """The spec's value for `value` (from a request, a stored document or an answer)."""
        if self.stored is not None:
            return self.stored(value)
        return self.type(value) if self.type in (int, float) else value

    def stored_default(self) -> Any:
        return self.to_stored(self.default)


SETTINGS: tuple[Setting, ...] = (
    Setting("name", str, REQUIRED, NAME, {"pattern": f"^{NAME}$"}),
    Setting("size", int, REQUIRED, "Prompt ids are 0..size-1 (verl's extra_info.index).", {"ge": 1}),
    Setting("rollouts_per_prompt", int, 8, "K, rollouts per prompt per step.", {"ge": 1, "le": "K_MAX"}),
    Setting(
        "success_threshold",
        float,
        1.0,
        "A reward >= threshold is a success (binary mode).",
        stored=_threshold,
    ),
    Setting(
        "beta_prior",
        list[float],
        [1.0, 1.0],
        lambda domain: (
            f"[alpha0, beta0], each in [{domain.PRIOR_MIN:g}, {domain.PRIOR_MAX:g}] "
            "(the numerically safe domain)."
        ),
        {"min_length": 2, "max_length": 2},
        stored=_pair,
        stored_type=tuple[float, float],
        check="prior_problem",
    ),
    Setting("beta_decay", float, 1.0, "Forgetting factor of the Beta update, in (0, 1].", {"gt": 0, "le": 1}),
    Setting("hmm_decay", float, 0.7, "Forgetting factor of the DPS update, in (0, 1].", {"gt": 0, "le": 1}),
    Setting(
        "reward_mode",
        str,
        "binary",
        "binary: success = reward >= threshold; fractional: rewards in [0,1] summed.",
        choices=("binary", "fractional"),
    ),
    Setting(
        "defaults",
        dict[str, dict[str, Any]],
        {},
        "Per-strategy selection defaults, e.g. {'insight': {'eta': 2.0}}.",
        stored=_object,
    ),
    Setting(
        "max_lag",
        int,
        0,
        "Late observations: an observe for a step closed at most this many steps ago is applied "
        "(Beta at once, DPS pooled into the open step) and answered with its lag; 0 = strict (409).",
        {"ge": 0, "le": MAX_LAG},
        later=True,
    ),
    Setting(
        "prior_strength",
        float,
        2.0,
        "Cold start (docs/methods.md §6): weight, in rollouts, of a prompt's prior pass rate (its own "
        "from PUT /datasets/{name}/metadata, else its group's rate) in its Beta prior.",
        {"ge": 0, "le": "PRIOR_STRENGTH_MAX"},
        later=True,
        rule=True,
    ),
    Setting(
        "group_decay",
        float,
        0.9,
        "Cold start (docs/methods.md §6): the group rates' successes and trials are multiplied by this "
        "at every step close, in (0, 1].",
        {"gt": 0, "le": 1},
        later=True,
        rule=True,
    ),
)

#: The settings a create may leave out, with their defaults as the spec holds them.
DEFAULTS: dict[str, Any] = {s.name: s.stored_default() for s in SETTINGS if not s.required}
#: The settings that are DatasetRules fields of the same name.
RULES: tuple[str, ...] = tuple(s.name for s in SETTINGS if s.rule)


# ---- the service's view: bounds and checks resolved against core/domain.py -------------------------
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
    """The info body's settings fields, in order: each required but the later ones (which older stored
    specs lack: they answer their defaults)."""
    return {s.name: (s.type, s.default if s.later else ...) for s in SETTINGS}


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


# ---- the stored spec and the client's info -----------------------------------------------------------
def from_doc(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a stored document or an answer, as the spec holds them; a setting the document
    lacks (one added after it was written) has its default."""
    return {s.name: s.to_stored(doc[s.name] if s.required else doc.get(s.name, s.default)) for s in SETTINGS}


def from_request(request: Any) -> dict[str, Any]:
    """The settings of a create body (schemas.DatasetCreate), as the spec holds them."""
    return {s.name: s.to_stored(getattr(request, s.name)) for s in SETTINGS}


def create_body(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """POST /datasets's body from the client's create arguments (None = the default). A later setting
    is sent only when it differs from its default, so that a body that does not use it also creates on
    a service from before it; `defaults` only when given."""
    body: dict[str, Any] = {}
    for s in SETTINGS:
        value = arguments.get(s.name)
        if value is None or (s.later and value == s.default):
            if s.required:
                raise TypeError(f"create_dataset needs {s.name}")
            if s.later or isinstance(s.default, dict):
                continue
            value = s.default
        value = s.to_stored(value)
        body[s.name] = (
            list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) else value
        )
    return body
