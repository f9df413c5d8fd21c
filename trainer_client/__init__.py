"""rlvr-selector's trainer side: a typed client for the selector service and a GRPO trainer using it.

Importing the package (or ``trainer_client.client``) needs only ``httpx``; the trainer modules
(``grpo``, ``rollout``, ``train``, ``model``) import PyTorch and transformers when they are used.
"""

from trainer_client.client import (
    AsyncSelectorClient,
    AuthError,
    Conflict,
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

__all__ = [
    "AsyncSelectorClient",
    "AuthError",
    "Conflict",
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
]
