"""Every arm the replay runs, by the name it reports, each defined once.

- `uniform`: the service's strategy ``uniform``, without the profile.
- `filter`: the static pass-rate filter teams run before a run, on the service: strategy ``filter``
  judging the uploaded profile alone (``reprofile`` false) with the bounds that keep exactly the prompts
  mixed in it, neither all solved nor all failed (`rlvr_selector_client.recommend.static_filter_params`;
  a prompt the profile did not observe is kept, nothing being known of it).
- `filter_reprofile`: the service's strategy ``filter`` at its defaults, ``reprofile`` true: the same
  profile uploaded, then each prompt's belief moved by the run's outcomes as they come.
- `filter_latest_outcome`: a prompt dropped or readmitted by its latest group alone
  (protocol.LatestOutcomeFilterArm), a rule the service's filter does not express.
- ``NAME`` and ``NAME+profile``: every other strategy the service offers, without and with the profile
  (INSIGHT then gets `RATE_PARAMS`' mu 0.5, as the trainer sends it with pass rates); with `--filter`,
  also ``NAME+filter`` and ``NAME+profile+filter``, the same with a select's ``filter`` object.

The three filters and every ``+profile`` arm upload epoch 0 as the profile, each rate with its samples
and counted by the service (service.py); `filter_latest_outcome` counts it itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlvr_selector_client.client import SelectorClient
from rlvr_selector_client.contract import DEFAULTS
from rlvr_selector_client.recommend import RATE_PARAMS, static_filter_params
from selector_service.replay.protocol import Arm, ArmSkipped, EpochTable, LatestOutcomeFilterArm
from selector_service.replay.service import ServiceArm

__all__ = ["BASELINES", "FILTER", "PROFILE", "StaticFilterArm", "arm_names", "build_arm"]

PROFILE = "+profile"
FILTER = "+filter"


class StaticFilterArm(ServiceArm):
    """`filter` (module docstring): its bounds follow the profile's group sizes, known at `begin`."""

    def __init__(self, client: SelectorClient, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(client, "filter", profile=True, seed=seed, name="filter", **kwargs)

    def begin(self, table: EpochTable) -> None:
        counts = np.unique(table.epochs[0].trials).tolist()
        prior = self.settings.get("beta_prior", DEFAULTS["beta_prior"])
        try:
            self.params = static_filter_params(counts, prior)
        except ValueError as exc:
            raise ArmSkipped(str(exc)) from None
        super().begin(table)


#: The baselines, by name: what builds each from a client and the replay's seed.
BASELINES: dict[str, Callable[[SelectorClient, int], Arm]] = {
    "uniform": lambda client, seed: ServiceArm(client, "uniform", profile=False, seed=seed),
    "filter": lambda client, seed: StaticFilterArm(client, seed),
    "filter_reprofile": lambda client, seed: ServiceArm(
        client, "filter", profile=True, seed=seed, name="filter_reprofile"
    ),
    LatestOutcomeFilterArm.name: lambda client, seed: LatestOutcomeFilterArm(seed),
}


def arm_names(strategies: Sequence[str], with_filter: bool = False) -> list[str]:
    """Every arm, in the order the table lists them: the baselines, then each strategy of the service
    without and with the profile (and, `with_filter`, each of those with a select's filter). Strategy
    ``filter`` is the filter baselines' and is not listed again; a name listed already (``uniform``)
    is not listed twice."""
    names = list(BASELINES)
    for strategy in strategies:
        if strategy == "filter":
            continue
        variants = [strategy, strategy + PROFILE]
        if with_filter:
            variants += [strategy + FILTER, strategy + PROFILE + FILTER]
        names += [n for n in variants if n not in names]
    return names


def build_arm(
    name: str, client: SelectorClient, seed: int = 0, filter: Mapping[str, Any] | None = None
) -> Arm:
    """The arm `name` (`arm_names`); a ``+filter`` arm selects with the filter object `filter`
    (None: ``{}``, the service's defaults)."""
    if name in BASELINES:
        return BASELINES[name](client, seed)
    filtered = name.endswith(FILTER)
    base = name.removesuffix(FILTER)
    profile = base.endswith(PROFILE)
    strategy = base.removesuffix(PROFILE)
    params = RATE_PARAMS.get(strategy, {}) if profile else {}
    return ServiceArm(
        client,
        strategy,
        profile=profile,
        seed=seed,
        params=params,
        filter=(dict(filter or {}) if filtered else None),
        name=name,
    )
