"""rlvr-selector's service: per-prompt Bayesian beliefs for RLVR data selection, served over REST.

Layers (imports point down only): `app` (FastAPI routes) -> `engine` (datasets kept in step with the
store) -> `state` (one dataset's beliefs, log application, snapshots) -> `core` (numerics: numba kernels
with numpy twins). `store` holds every Redis key and script; `core` imports nothing of ours.
"""

__version__ = "0.1.0"
