"""jsonscan.array_separators against its twin (tests/core/naive.py): random JSON arrays of any values
(strings full of commas, brackets, quotes and escapes, nesting, non-ASCII), written with any spacing."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from selector_service.contract.jsonscan import array_separators
from tests.core import naive

TRICKY = st.text(alphabet=st.sampled_from(list(',[]{}"\\:/ \t\né€\U0001f600ab1')), max_size=12)
VALUES = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), TRICKY
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TRICKY, inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=1500, deadline=None)
@given(
    items=st.lists(VALUES, max_size=8),
    ascii_only=st.booleans(),
    indent=st.sampled_from([None, 0, 2]),
    separators=st.sampled_from([(",", ":"), (", ", ": "), (" ,  ", " : ")]),
    lead=st.sampled_from(["", " ", "\n\t "]),
)
def test_separators_match_the_twin(items, ascii_only, indent, separators, lead):
    text = (lead + json.dumps(items, ensure_ascii=ascii_only, indent=indent, separators=separators)).encode()
    got = array_separators(text)
    assert got is not None and got.dtype == np.int64
    assert got.tolist() == naive.array_separators(text)


def test_what_is_not_an_array_gives_none():
    for text in (b"{}", b"1", b'"[1,2]"', b"  ", b"", b"[1,2"):
        assert array_separators(text) is None
