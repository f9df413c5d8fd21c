"""The client side of rlvr-selector: what a trainer's environment installs.

- `rlvr_selector_client.client`: the typed sync and async client of the service's REST contract
  (docs/api.md), re-exported here.
- `rlvr_selector_client.contract`: the contract's version and declarations (dataset settings, names),
  which the service imports too.
- `rlvr_selector_client.integrations`: the adapters for verl, TRL, AReaL, OpenRLHF and slime, with the
  step sampler and request ids they share; each adapter imports its framework when it is imported.

Importing the package needs only httpx.
"""

from pathlib import Path

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
    Result,
    RolloutBudget,
    Selection,
    SelectorClient,
    SelectorError,
    ServiceUnavailable,
)
from rlvr_selector_client.contract import CONTRACT

#: The release, shared by the client and service distributions (VERSION, read by both pyprojects).
__version__ = Path(__file__).with_name("VERSION").read_text().strip()

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
    "Result",
    "RolloutBudget",
    "Selection",
    "SelectorClient",
    "SelectorError",
    "ServiceUnavailable",
    "__version__",
]
