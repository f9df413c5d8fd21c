"""The client side of rlvr-selector: what a trainer's environment installs.

- `rlvr_selector_client.client`: the typed sync and async client of the service's REST contract
  (docs/api.md), re-exported here.
- `rlvr_selector_client.contract`: the contract's version and declarations (dataset settings, names),
  which the service imports too.
- `rlvr_selector_client.integrations`: the adapters for verl, TRL, AReaL, OpenRLHF, slime, the Tinker
  cookbook and SkyRL, with the step sampler and request ids they share; each adapter imports its
  framework when it is imported.

Importing the package needs only httpx, and loads it only when a name of the client is first used:
the contract (`rlvr_selector_client.contract`, standard library only) is what the service's numerics
import, and importing it loads no HTTP client.
"""

from __future__ import annotations

import os
from importlib import import_module
from typing import TYPE_CHECKING, Any

from rlvr_selector_client.contract import CONTRACT

if TYPE_CHECKING:
    from rlvr_selector_client.client import (
        AsyncSelectorClient,
        AuthError,
        Conflict,
        ContractMismatch,
        DatasetInfo,
        InvalidRequest,
        MetadataAck,
        NotFound,
        ObserveAck,
        OutcomeUnknown,
        Result,
        RolloutBudget,
        Selection,
        SelectorClient,
        SelectorError,
        ServiceUnavailable,
    )

#: The release, shared by the client and service distributions (VERSION, read by both pyprojects).
with open(os.path.join(os.path.dirname(__file__), "VERSION"), encoding="utf-8") as _file:
    __version__ = _file.read().strip()

__all__ = [
    "CONTRACT",
    "AsyncSelectorClient",
    "AuthError",
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
    "Selection",
    "SelectorClient",
    "SelectorError",
    "ServiceUnavailable",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """The client's names, imported from `rlvr_selector_client.client` when first asked for (PEP 562)."""
    if name in __all__ and name not in ("CONTRACT", "__version__"):
        value = getattr(import_module("rlvr_selector_client.client"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
