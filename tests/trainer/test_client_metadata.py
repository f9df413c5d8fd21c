"""The client's metadata upload (rlvr_selector_client.client.upload_metadata): how an upload is cut into
requests and encoded. The calls against a real service are in tests/service/test_metadata.py."""

from __future__ import annotations

import math
import struct

import pytest

from rlvr_selector_client import client as tc


def test_small_uploads_are_one_json_request_with_nulls_for_unknown_rates():
    (call,) = tc._metadata_calls("ds", [0.5, None, float("nan"), 1.0], [3, -1, 0, 65535], 7, None)
    assert (call.method, call.path) == ("PUT", "/datasets/ds/metadata")
    assert call.json == {"offset": 7, "pass_rate": [0.5, None, None, 1.0], "group": [3, -1, 0, 65535]}
    assert call.content is None and call.send_kwargs()["json"] == call.json


def test_large_uploads_are_cut_into_chunks_with_their_offsets(monkeypatch):
    monkeypatch.setattr(tc, "METADATA_JSON_CHUNK", 4)
    calls = list(tc._metadata_calls("ds", None, list(range(10)), 100, raw=False))
    assert [c.json["offset"] for c in calls] == [100, 104, 108]
    assert [c.json["group"] for c in calls] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all("pass_rate" not in c.json for c in calls)


def test_raw_uploads_are_little_endian_float32_and_int32_per_field(monkeypatch):
    monkeypatch.setattr(tc, "METADATA_RAW_CHUNK", 2)
    calls = list(tc._metadata_calls("d s", [0.25, None, 0.75], [1, -1, 2], 5, raw=True))
    assert [(c.path, c.params["offset"]) for c in calls] == [
        ("/datasets/d%20s/metadata/pass_rate", "5"),
        ("/datasets/d%20s/metadata/pass_rate", "7"),
        ("/datasets/d%20s/metadata/group", "5"),
        ("/datasets/d%20s/metadata/group", "7"),
    ]
    first = struct.unpack("<2f", calls[0].content)
    assert first[0] == 0.25 and math.isnan(first[1])
    assert struct.unpack("<f", calls[1].content) == (0.75,)
    assert struct.unpack("<2i", calls[2].content) == (1, -1)
    kwargs = calls[3].send_kwargs()
    assert kwargs["headers"]["Content-Type"] == "application/octet-stream" and "json" not in kwargs


def test_raw_is_the_default_above_the_json_chunk(monkeypatch):
    monkeypatch.setattr(tc, "METADATA_JSON_CHUNK", 3)
    assert next(tc._metadata_calls("ds", [0.1] * 3, None, 0, None)).content is None
    assert next(tc._metadata_calls("ds", [0.1] * 4, None, 0, None)).content is not None


@pytest.mark.parametrize(
    ("rates", "groups", "offset", "message"),
    [
        (None, None, 0, "needs pass_rate, group, pass_samples"),
        ([1.5], None, 0, r"pass_rate\[0\] = 1.5"),
        ([-0.1], None, 0, "lie in"),
        (None, [65536], 0, r"group\[0\]"),
        (None, [-2], 0, "groups are integers"),
        (None, [1.5], 0, "groups are integers"),
        ([0.5, 0.5], [1], 0, "one per prompt"),
        ([], None, 0, "empty"),
        ([0.5], None, -1, "offset"),
    ],
)
def test_bad_uploads_are_refused_before_anything_is_sent(rates, groups, offset, message):
    with pytest.raises(ValueError, match=message):
        tc._metadata_calls("ds", rates, groups, offset, None)


def test_sample_counts_go_with_their_rates_and_say_whether_they_were_profiling(monkeypatch):
    (call,) = tc._metadata_calls("ds", [0.5, None], None, 3, None, [8, None], True)
    assert call.json == {"offset": 3, "pass_rate": [0.5, None], "pass_samples": [8, None], "profile": True}
    (shipped,) = tc._metadata_calls("ds", [0.5], None, 0, None, [16])
    assert "profile" not in shipped.json
    monkeypatch.setattr(tc, "METADATA_RAW_CHUNK", 2)
    calls = list(tc._metadata_calls("ds", None, None, 5, True, [4, None, 16], True))
    assert [(c.path, c.params) for c in calls] == [
        ("/datasets/ds/metadata/pass_samples", {"offset": "5", "profile": "true"}),
        ("/datasets/ds/metadata/pass_samples", {"offset": "7", "profile": "true"}),
    ]
    assert struct.unpack("<2i", calls[0].content) == (4, -1) and struct.unpack("<i", calls[1].content) == (
        16,
    )


@pytest.mark.parametrize(
    ("samples", "profile", "message"),
    [
        ([0], False, r"pass_samples\[0\] = 0"),
        ([1.5], False, r"pass_samples\[0\] = 1.5"),
        ([1_000_001], False, "1..1000000"),
        ([True], False, "whole number"),
        ([8, 8], False, "one per prompt"),
        (None, True, "give them as pass_samples"),
        ([8], "yes", "profile must be True or False"),
    ],
)
def test_bad_sample_counts_are_refused_before_anything_is_sent(samples, profile, message):
    with pytest.raises(ValueError, match=message):
        tc._metadata_calls("ds", [0.5], None, 0, None, samples, profile)


def test_a_bad_value_late_in_a_large_upload_sends_nothing(monkeypatch):
    """Every chunk is checked before the first request is built: a bad count in the last chunk refuses
    the whole upload, naming its index in the upload."""
    monkeypatch.setattr(tc, "METADATA_RAW_CHUNK", 2)
    with pytest.raises(ValueError, match=r"pass_samples\[4\] = 0"):
        tc._metadata_calls("ds", [0.5] * 5, None, 0, True, [8, 8, 8, 8, 0])


def test_numpy_arrays_are_packed_as_lists_are_and_checked_the_same(monkeypatch):
    """A numpy array is read through its buffer (no Python object per value): the same bodies as a
    list of the same values, a strided view too, and a bad value refused naming its index."""
    np = pytest.importorskip("numpy")
    monkeypatch.setattr(tc, "METADATA_RAW_CHUNK", 4)
    rates = np.array([0.5, np.nan, 0.0, 1.0, 0.25, 0.125], dtype=np.float32)
    counts = np.array([8, -1, 16, 1, 2, 1_000_000], dtype=np.int32)
    as_arrays = [c.content for c in tc._metadata_calls("ds", rates, None, 0, True, counts, True)]
    as_lists = [
        c.content for c in tc._metadata_calls("ds", rates.tolist(), None, 0, True, counts.tolist(), True)
    ]
    assert as_arrays == as_lists and len(as_arrays) == 4
    strided = np.repeat(rates, 2)[::2]
    assert [c.content for c in tc._metadata_calls("ds", strided, None, 0, True)] == as_arrays[:2]
    wide = np.array([8, 16, 2**40], dtype=np.int64)
    with pytest.raises(ValueError, match=r"pass_samples\[2\] = 1099511627776"):
        tc._metadata_calls("ds", None, None, 0, True, wide)
    with pytest.raises(ValueError, match=r"pass_rate\[5\] = 1.5"):
        tc._metadata_calls("ds", np.array([0.5] * 5 + [1.5]), None, 0, True)
    with pytest.raises(ValueError, match=r"group\[1\]"):
        tc._metadata_calls("ds", None, np.array([3, -2], dtype=np.int16), 0, True)
