"""The selector service's contract as the client and the service both read it, declared once here.

- `CONTRACT`, the contract's version: the client sends it with every request (`CONTRACT_HEADER`), the
  service answers with its own, and each refuses the other's when they differ, saying which package to
  upgrade (`mismatch`).
- Names and their patterns: a dataset's name (`NAME`), a report's request id (`REQUEST_ID`), the id of
  the client's call an observe belongs to (`CALL_HEADER`, `CALL_ID`).
- A select's rollout budget: its policies and the bounds of its counts (`rollout_problems`), which the
  service, the trainer's options and the integrations' options check.
- Each dataset setting of POST /datasets (docs/api.md), declared once as a field of `DatasetSettings`
  with its type, default and description (`SETTINGS` reads them). From them follow the client's create
  parameters and body (`create_body`) and the settings of its DatasetInfo (`from_doc`,
  `INFO_DEFAULTED`); the service's stored spec is that class, and it builds its create and info bodies,
  its checks and the constants its kernels read from the same declaration
  (selector_service/contract/dataset_settings.py).

Standard library only: it is imported in trainers' environments, beside whatever they pin. The bounds
that are the service's numerically safe domain are named here, not given: a constraint given as a
string ("K_MAX"), a `check` and a description given as a function of the module are the service's
selector_service/core/domain.py's, which the service reads when it builds its bodies. The client needs
no bound to create a dataset (the service checks every value and says what is wrong); those it checks
before an upload (`MAX_GROUPS`, `PASS_SAMPLES_MAX`) are given here, and the service reads them too.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

#: The contract's version. It changes only when a change to the REST contract is not an extension
#: (docs/api.md: endpoints and fields are added, never changed), which the two sides cannot talk across.
CONTRACT = 1
#: The header that carries `CONTRACT`, on every request of the client and every answer of the service.
CONTRACT_HEADER = "Selector-Contract"
#: The client's distribution, which a trainer's environment installs.
CLIENT_DISTRIBUTION = "rlvr-selector-client"
#: The service's distribution.
SERVICE_DISTRIBUTION = "rlvr-selector"


def mismatch(client: str | int | None, service: str | int | None) -> str | None:
    """What to upgrade when the client and the service speak other contract versions, or None when they
    speak the same one. A side that names no version (curl, a proxy's own answer) speaks 1."""
    try:
        mine, theirs = int(client or 1), int(service or 1)
    except ValueError:
        return (
            f"unreadable {CONTRACT_HEADER} header (client {client!r}, service {service!r}); "
            f"send an integer, or use {CLIENT_DISTRIBUTION} and {SERVICE_DISTRIBUTION} of one release"
        )
    if mine == theirs:
        return None
    if mine < theirs:
        return (
            f"the client speaks contract {mine} and the service contract {theirs}: upgrade the client "
            f"in the trainer's environment (pip install -U {CLIENT_DISTRIBUTION})"
        )
    return (
        f"the client speaks contract {mine} and the service contract {theirs}: upgrade the service "
        f"(pip install -U {SERVICE_DISTRIBUTION}, or its image), or install the {CLIENT_DISTRIBUTION} release "
        "that matches it in the trainer's environment"
    )


#: A dataset's name (without the anchors of its pattern, which is also how the API describes it).
NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
#: A report's request id (POST /observe): printable characters (without the anchors of its pattern),
#: 1 to `REQUEST_ID_MAX` of them.
REQUEST_ID = r"[^\x00-\x1f\x7f]+"
REQUEST_ID_MAX = 128
#: The header of an observe that names the client's call (an extension of the contract, docs/api.md section
#: 4): every attempt of one call carries the same id, and the service answers an attempt whose call was
#: applied already with what it applied (``applied: n, duplicate: false``) instead of as a duplicate.
CALL_HEADER = "Selector-Call"
#: A call id (without the anchors of its pattern): 1 to 64 letters, digits, '-' or '_'.
CALL_ID = r"[A-Za-z0-9_-]{1,64}"
#: The largest training step a request may name (select, observe, a history query's `since`).
MAX_STEP = 10**12
#: The most steps late an observation may be accepted (max_lag).
MAX_LAG = 1000
#: A metadata upload's groups are 0..MAX_GROUPS-1, -1 = none (docs/methods.md §6: G <= 65,536).
MAX_GROUPS = 65_536
#: The most samples one uploaded pass rate may stand for (pass_samples; a rate worth a million rollouts
#: at most, which keeps a cold prior inside the numerically safe domain, core/domain.py).
PASS_SAMPLES_MAX = 1_000_000


#: The policies a select's rollout budget may name (docs/methods.md §8), in the order /strategies lists
#: them, and the one a budget without a policy gets.
ROLLOUT_POLICIES = ("posterior", "knapsack", "variance", "uniform")
DEFAULT_ROLLOUT_POLICY = "posterior"


def rollout_problems(
    budget: int,
    min_rollouts: int,
    max_rollouts: int | None,
    batch_size: int | None = None,
    limit: int | None = None,
) -> tuple[str, ...]:
    """Which bounds of a rollout budget are broken, in the order they are named: "min" (min_rollouts
    < 1), "limit" (max_rollouts above `limit`), "order" (max_rollouts below min_rollouts), and, for a
    batch of `batch_size` prompts, "below" (budget < batch_size x min_rollouts) or else "above"
    (budget > batch_size x max_rollouts). max_rollouts None bounds nothing.

    The rule of the service's check, the trainer's options and the integrations' options, which each
    word its own problems: the others are compared with min_rollouts at least 1, so that a bad min is
    named once."""
    low = max(min_rollouts, 1)
    broken = []
    if min_rollouts < 1:
        broken.append("min")
    if limit is not None and max_rollouts is not None and max_rollouts > limit:
        broken.append("limit")
    if max_rollouts is not None and max_rollouts < low:
        broken.append("order")
    if batch_size is not None:
        if budget < batch_size * low:
            broken.append("below")
        elif max_rollouts is not None and budget > batch_size * max_rollouts:
            broken.append("above")
    return tuple(broken)


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
    """One dataset setting: how the bodies describe and bound it, given as the annotation of its field of
    `DatasetSettings`, and its name, type and default, which `SETTINGS` reads from that field.

    `constraints` are pydantic Field constraints of the create body (a string value names a constant of
    core/domain.py); `choices` make the create body's type a Literal of them. `stored` turns a request's,
    a stored document's or an answer's value into the spec's. `check` names a function of core/domain.py
    that says what is wrong with a value (or None), used instead of the constraints' own check. `body`:
    the bodies' type where it is not the spec's (a list where the spec holds a tuple).
    """

    description: str | Callable[[Any], str]
    constraints: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    choices: tuple[str, ...] = ()
    stored: Callable[[Any], Any] | None = None
    check: str = ""
    body: Any = None
    #: From the declaration: the field's name, its type in the bodies (`body`, else the spec's), its default.
    name: str = ""
    type: Any = None
    default: Any = None

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


def _prior_description(domain: Any) -> str:
    return f"[alpha0, beta0], each in [{domain.PRIOR_MIN:g}, {domain.PRIOR_MAX:g}] (the numerically safe domain)."


@dataclass(frozen=True)
class DatasetSettings:
    """Every setting of a dataset (POST /datasets, docs/api.md), declared once: one field per setting, in
    the order the bodies list them, typed as the stored spec holds it, with its default (none: every
    create gives it) and, as its annotation, the Setting that describes and bounds it in the bodies.

    The service's stored spec is this class with the incarnation's uid (state.DatasetSpec); its create and
    info bodies, and the client's create body and DatasetInfo, follow `SETTINGS`.
    """

    name: Annotated[str, Setting(NAME, {"pattern": f"^{NAME}$"})]
    size: Annotated[int, Setting("Prompt ids are 0..size-1 (verl's extra_info.index).", {"ge": 1})]
    rollouts_per_prompt: Annotated[
        int, Setting("K, rollouts per prompt per step.", {"ge": 1, "le": "K_MAX"})
    ] = 8
    success_threshold: Annotated[
        float, Setting("A reward >= threshold is a success (binary mode).", stored=_threshold)
    ] = 1.0
    beta_prior: Annotated[
        tuple[float, float],
        Setting(
            _prior_description,
            {"min_length": 2, "max_length": 2},
            stored=_pair,
            check="prior_problem",
            body=list[float],
        ),
    ] = (1.0, 1.0)
    beta_decay: Annotated[
        float, Setting("Forgetting factor of the Beta update, in (0, 1].", {"gt": 0, "le": 1})
    ] = 1.0
    hmm_decay: Annotated[
        float, Setting("Forgetting factor of the DPS update, in (0, 1].", {"gt": 0, "le": 1})
    ] = 0.7
    reward_mode: Annotated[
        str,
        Setting(
            "binary: success = reward >= threshold; fractional: rewards in [0,1] summed.",
            choices=("binary", "fractional"),
        ),
    ] = "binary"
    defaults: Annotated[
        dict[str, dict[str, Any]],
        Setting("Per-strategy selection defaults, e.g. {'insight': {'eta': 2.0}}.", stored=_object),
    ] = dataclasses.field(default_factory=dict)
    max_lag: Annotated[
        int,
        Setting(
            "Late observations: an observe for a step closed at most this many steps ago is applied "
            "(Beta at once, DPS pooled into the open step) and answered with its lag; 0 = strict (409).",
            {"ge": 0, "le": MAX_LAG},
        ),
    ] = 0
    prior_strength: Annotated[
        float,
        Setting(
            "Cold start (docs/methods.md §6): weight, in rollouts, of a prompt's prior pass rate (its own "
            "from PUT /datasets/{name}/metadata, else its group's rate) in its Beta prior.",
            {"ge": 0, "le": "PRIOR_STRENGTH_MAX"},
        ),
    ] = 2.0
    group_decay: Annotated[
        float,
        Setting(
            "Cold start (docs/methods.md §6): the group rates' successes and trials are multiplied by this "
            "at every step close, in (0, 1].",
            {"gt": 0, "le": 1},
        ),
    ] = 0.9


def _declared() -> tuple[Setting, ...]:
    """Each field of DatasetSettings as its Setting, with the field's name, type and default."""
    hints = typing.get_type_hints(DatasetSettings, include_extras=True)
    out = []
    for f in dataclasses.fields(DatasetSettings):
        spec_type, about = typing.get_args(hints[f.name])
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        out.append(dataclasses.replace(about, name=f.name, type=about.body or spec_type, default=default))
    return tuple(out)


SETTINGS: tuple[Setting, ...] = _declared()

#: The settings a create may leave out, with their defaults as the spec holds them.
DEFAULTS: dict[str, Any] = {s.name: s.stored_default() for s in SETTINGS if not s.required}
#: The settings that the info body's schema (GET /datasets/{name}, /openapi.json) gives a default, the
#: others it requires; the published schema of contract 1 says so, and changes only with the contract.
INFO_DEFAULTED: tuple[str, ...] = ("max_lag", "prior_strength", "group_decay")


# ---- the stored spec and the client's info -----------------------------------------------------------
def from_doc(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of an answer (or a stored document), as the spec holds them; a setting that is not
    required and that the document leaves out has its default, as in a create body."""
    return {s.name: s.to_stored(doc[s.name] if s.required else doc.get(s.name, s.default)) for s in SETTINGS}


def create_body(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """POST /datasets's body from the client's create arguments (None = the default): every setting,
    but `defaults` only when given."""
    body: dict[str, Any] = {}
    for s in SETTINGS:
        value = arguments.get(s.name)
        if value is None:
            if s.required:
                raise TypeError(f"create_dataset needs {s.name}")
            if isinstance(s.default, dict):
                continue
            value = s.default
        value = s.to_stored(value)
        body[s.name] = (
            list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) else value
        )
    return body
