"""rlvr-selector's service: per-prompt Bayesian beliefs for RLVR data selection, served over REST.

Layers (imports point down only): `app` (FastAPI routes) -> `engine` (datasets kept in step with the
store) -> `state` (one dataset's beliefs, log application, snapshots) -> `core` (numerics: numba kernels
with numpy twins). `store` holds every Redis key and script; `core` imports nothing of ours but the
contract's declarations (`rlvr_selector_client.contract`, standard library only; tests/core/test_layering.py).
"""

# One release for the service and the client package (client/rlvr_selector_client/VERSION).
from rlvr_selector_client import __version__

__all__ = ["__version__"]
