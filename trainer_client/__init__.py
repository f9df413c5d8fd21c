"""rlvr-selector's GRPO trainer, which asks the selector service for every batch.

The typed client it talks through is the client package's (``rlvr_selector_client``, re-exported here);
importing this package needs only that and ``httpx``; the trainer modules
(``grpo``, ``rollout``, ``train``, ``model``) import PyTorch and transformers when they are used.
"""

from rlvr_selector_client.client import (
    AsyncSelectorClient,
    AuthError,
    Conflict,
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

__all__ = [
    "AsyncSelectorClient",
    "AuthError",
    "Conflict",
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
]
