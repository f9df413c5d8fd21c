"""The client side of rlvr-selector: what a trainer's environment installs.

- `rlvr_selector_client.client`: the typed sync and async client of the service's REST contract
  (docs/api.md), re-exported here.
- `rlvr_selector_client.contract`: the contract's version and declarations (dataset settings, names),
  which the service imports too.
- `rlvr_selector_client.integrations`: the adapters for verl, TRL, AReaL, OpenRLHF, slime, the Tinker
  cookbook and SkyRL, with the step sampler and request ids they share; each adapter imports its
  framework when it is imported.

Importing the package needs only httpx.
"""

import os

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
from rlvr_selector_client.contract import CONTRACT

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
