"""Dependencies every route shares: the engine and settings of the running app, the dataset name in the
path, and the bearer-token check.

The engine and settings live on `app.state` (create_app puts the settings there, the lifespan the
engine), so a route reaches them through its request and never through a closure. The dependencies are
`async`: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request.
"""

from __future__ import annotations

import hmac
import re
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BeforeValidator
from starlette.exceptions import HTTPException as StarletteHTTPException

from selector_service.replication.engine import Engine
from selector_service.settings import Settings


async def engine_of(request: Request) -> Engine:
    engine: Engine = request.app.state.engine  # set by the lifespan (app.py)
    return engine


async def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings  # set by create_app
    return settings


EngineDep = Annotated[Engine, Depends(engine_of)]
SettingsDep = Annotated[Settings, Depends(settings_of)]
NamePath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", description="dataset name")]

_DIGITS = re.compile(r"[0-9]+")


def _digits_only(value: object) -> object:
    """An integer in a query string is ASCII digits, as the ids of /beliefs are: pydantic's lax int
    would read ` 1` as 1 and `1_0` as 10, a value the client did not write."""
    if isinstance(value, str) and not _DIGITS.fullmatch(value):
        raise ValueError("must be ASCII decimal digits only (no sign, space, underscore, point or exponent)")
    return value


#: Wraps an `int` query parameter: `Annotated[int, DigitsOnly, Query(...)]`.
DigitsOnly = BeforeValidator(_digits_only)


# Declares the bearer scheme in the OpenAPI document (an Authorize button in /docs, auth in generated
# clients); it refuses nothing itself: require_token decides.
_BEARER = HTTPBearer(
    auto_error=False, description="The service's SELECTOR_API_TOKEN; not needed when it runs without one."
)


async def require_token(
    request: Request, _declared: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)] = None
) -> None:
    """401 without `Authorization: Bearer <token>`, 403 with another token; nothing when the service
    runs without SELECTOR_API_TOKEN. The comparison takes the same time whatever the token sent."""
    secret = request.app.state.settings.api_token
    if not secret:  # unset, or set to the empty string
        return
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not value:
        raise StarletteHTTPException(
            401,
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(value.strip().encode(), secret.get_secret_value().encode()):
        raise StarletteHTTPException(403, "wrong bearer token")
