# The part of numba that selector_service.core uses, typed for mypy (numba ships no type information).
# `njit` is typed as returning the function it compiles: a dispatcher is called with the kernel's own
# arguments, so callers are checked against the kernel's annotations (numba itself ignores them).
from collections.abc import Callable
from typing import Any, Literal, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

def njit(
    *,
    nogil: bool = ...,
    cache: bool = ...,
    parallel: bool = ...,
    fastmath: bool = ...,
    boundscheck: bool = ...,
    inline: Literal["never", "always"] = ...,
    error_model: Literal["python", "numpy"] = ...,
) -> Callable[[_F], _F]: ...

# Inside a kernel, `prange` is a `range` whose iterations numba may run in parallel.
prange = range
