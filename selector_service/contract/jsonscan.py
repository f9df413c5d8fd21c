"""Where a JSON array's elements end, found without the GIL.

POST /observe decodes its up to 16 MiB body in batches of results (schemas.decode_observe) so that no
single decoding call holds the GIL for long. Cutting the results array into batches needs the positions
of its top-level commas; a Python loop over 16 MiB would take seconds, msgspec's own `list[Raw]` scan
holds the GIL for the whole body, and the standard library has nothing for it, so this small numba
kernel (nogil) scans the bytes while the event loop's thread keeps running.

The input must be one syntactically valid JSON array (msgspec has checked it: decode_observe reads the
array as `msgspec.Raw` first, which validates what it skips); the kernel only tracks strings (with their
backslash escapes) and nesting depth. Its slow twin is tests/core/naive.py `array_separators`.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["array_separators"]

_QUOTE, _BACKSLASH, _COMMA = 34, 92, 44  # " \ ,
# [ { open a level, ] } close one (91, 123, 93, 125); space, tab, LF, CR may precede the array.


@numba.njit(nogil=True, cache=True)
def _separators(buf: np.ndarray, out: np.ndarray) -> int:
    """Writes the positions of the array's top-level commas, then of its closing bracket, into `out`;
    returns how many it wrote (-1 if the text does not start with '[' or never closes)."""
    n = buf.size
    i = 0
    while i < n and buf[i] in (32, 9, 10, 13):
        i += 1
    if i == n or buf[i] != 91:
        return -1
    depth = 0
    count = 0
    in_string = False
    escaped = False
    while i < n:
        c = buf[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == _BACKSLASH:
                escaped = True
            elif c == _QUOTE:
                in_string = False
        elif c == _QUOTE:
            in_string = True
        elif c == 91 or c == 123:
            depth += 1
        elif c == 93 or c == 125:
            depth -= 1
            if depth == 0:
                out[count] = i
                return count + 1
        elif c == _COMMA and depth == 1:
            out[count] = i
            count += 1
        i += 1
    return -1


def array_separators(text: bytes | memoryview) -> np.ndarray | None:
    """int64 positions in `text` (a JSON array) of the commas between its top-level elements, then of
    its closing bracket: element k spans (seps[k-1] or the opening bracket) + 1 .. seps[k]. None when
    `text` is not an array. An empty array gives only the closing bracket, like a one-element one: tell
    them apart by what lies between the brackets."""
    buf = np.frombuffer(text, dtype=np.uint8)
    commas = int(np.count_nonzero(buf == _COMMA))  # an upper bound of the separators (fast, vectorized)
    out = np.empty(commas + 1, dtype=np.int64)
    count = _separators(buf, out)
    return None if count < 0 else out[:count]
