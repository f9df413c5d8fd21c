"""Reading a run's log for `selector-service replay`: every format gives the same groups, rewards go through
the success threshold as /observe counts them, prompts given as text get a stable id, and a bad log is
refused with a message that names its line or row."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from selector_service.replay.logs import Columns, LogError, RunLog, detect_format, prompt_key, read_log


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def groups(log: RunLog) -> dict[tuple[int, int], tuple[int, int]]:
    """{(step, key): (successes, trials)}."""
    keys = log.keys[log.prompts].tolist()
    return {
        (s, k): (a, b)
        for s, k, a, b in zip(
            log.steps.tolist(), keys, log.successes.tolist(), log.trials.tolist(), strict=True
        )
    }


REWARD_ROWS = [
    {"step": 3, "prompt_id": 7, "rewards": [1.0, 0.2, 0.9, 1.0]},
    {"step": 3, "prompt_id": 2, "rewards": [0, 0]},
    {"step": 1, "prompt_id": 7, "rewards": [0.95]},
]
EXPECTED = {(3, 7): (3, 4), (3, 2): (0, 2), (1, 7): (1, 1)}  # threshold 0.9


def test_group_rows_with_rewards_count_successes_at_the_threshold(tmp_path):
    log = read_log(write_jsonl(tmp_path / "run.jsonl", REWARD_ROWS), success_threshold=0.9)
    assert groups(log) == EXPECTED
    assert log.keys.tolist() == [2, 7] and log.n_prompts == 2 and log.rows == 3
    assert log.steps.tolist() == sorted(log.steps.tolist())  # ordered by step
    assert not log.hashed and not log.per_rollout and log.format == "rows"
    # The service's default threshold, 1.0: a reward of 0.95 fails.
    assert groups(read_log(tmp_path / "run.jsonl"))[(1, 7)] == (0, 1)


def test_counts_rows_and_one_reward_per_row(tmp_path):
    counts = [
        {"step": 0, "prompt_id": 4, "successes": 2, "trials": 8},
        {"step": 1, "prompt_id": 4, "successes": 0, "trials": 8},
    ]
    assert groups(read_log(write_jsonl(tmp_path / "c.jsonl", counts))) == {(0, 4): (2, 8), (1, 4): (0, 8)}
    # One rollout per row: the rows of a (step, prompt) pool into one group.
    rollouts = [{"step": 0, "prompt_id": 4, "rewards": r} for r in (1, 0, 1)] + [
        {"step": 0, "prompt_id": 9, "rewards": 0}
    ]
    log = read_log(write_jsonl(tmp_path / "r.jsonl", rollouts))
    assert log.per_rollout and groups(log) == {(0, 4): (2, 3), (0, 9): (0, 1)}


def test_text_prompts_get_a_stable_hash_and_columns_are_mapped(tmp_path):
    rows = [
        {"it": 5, "question": "what is 2 + 2?", "score": 1.0},
        {"it": 5, "question": "what is 2 + 2?", "score": 0.0},
        {"it": 6, "question": "name a prime", "score": 1.0},
    ]
    cols = Columns(prompt="question", step="it", rewards="score")
    log = read_log(write_jsonl(tmp_path / "t.jsonl", rows), columns=cols)
    expected = int.from_bytes(hashlib.sha256(b"what is 2 + 2?").digest()[:8], "big")
    assert prompt_key("what is 2 + 2?") == expected
    assert log.hashed and sorted(log.keys.tolist()) == sorted([expected, prompt_key("name a prime")])
    assert groups(log) == {(5, expected): (1, 2), (6, prompt_key("name a prime")): (1, 1)}


def test_parquet_gives_what_jsonl_gives(tmp_path):
    path = tmp_path / "run.parquet"
    pq.write_table(pa.Table.from_pylist(REWARD_ROWS), path)
    assert detect_format(path) == "rows"
    assert groups(read_log(path, success_threshold=0.9)) == EXPECTED
    counts = tmp_path / "counts.parquet"
    pq.write_table(
        pa.table({"step": [0, 0], "prompt_id": [1, 3], "successes": [1, 8], "trials": [8, 8]}), counts
    )
    assert groups(read_log(counts)) == {(0, 1): (1, 8), (0, 3): (8, 8)}
    text = tmp_path / "text.parquet"
    pq.write_table(pa.table({"step": [0, 0, 1], "q": ["a", "a", "b"], "r": [1.0, 0.0, 1.0]}), text)
    log = read_log(text, columns=Columns(prompt="q", rewards="r"))
    assert log.per_rollout and groups(log) == {(0, prompt_key("a")): (1, 2), (1, prompt_key("b")): (1, 1)}


def test_a_verl_dump_folder_is_read_by_its_fields(tmp_path):
    """The fields verl's _write_generations writes (the real dump: tests/integrations/test_verl_dump.py)."""
    dump = tmp_path / "rollouts"
    dump.mkdir()
    for step, scores in ((1, [1.0, 0.0]), (2, [0.0, 0.0])):
        lines = [{"input": "<|user|>q1", "output": "x", "gts": "1", "score": s, "step": step} for s in scores]
        write_jsonl(dump / f"{step}.jsonl", lines)
    assert detect_format(dump) == "verl"
    log = read_log(dump)
    assert log.format == "verl" and log.per_rollout and log.hashed
    assert groups(log) == {(1, prompt_key("<|user|>q1")): (1, 2), (2, prompt_key("<|user|>q1")): (0, 2)}


def test_the_accuracy_file_is_read_to_its_shortest_prompt(tmp_path):
    path = tmp_path / "acc.json"
    path.write_text(json.dumps({"10": [0.5, 1.0, 0.25], "2": [0.0, 0.125]}))
    assert detect_format(path) == "accuracy"
    log = read_log(path, trials=8)
    assert log.keys.tolist() == [2, 10]  # numeric order, as bench/rollout_trace.py reads it
    assert groups(log) == {(0, 2): (0, 8), (1, 2): (1, 8), (0, 10): (4, 8), (1, 10): (8, 8)}
    assert "first 2" in log.notes[0]


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ([{"step": 0, "prompt_id": 1, "rewards": [1]}, {"prompt_id": 1, "rewards": [1]}], ["line 2", "'step'", "--step-column"]),
        ([{"step": 0, "prompt_id": 1}], ["line 1", "'rewards'", "--reward-column"]),
        ([{"step": 0, "rewards": [1]}], ["line 1", "'prompt_id'", "--prompt-column"]),
        ([{"step": 0, "prompt_id": 1, "rewards": [1, "x"]}], ["line 1", "'x'", "not a number"]),
        ([{"step": 0, "prompt_id": 1, "rewards": "0.5"}], ["line 1", "not a number"]),
        ([{"step": "3", "prompt_id": 1, "rewards": [1]}], ["line 1", "not an integer"]),
        ([{"step": 0, "prompt_id": 1, "rewards": []}], ["line 1", "empty"]),
        ([{"step": 0, "prompt_id": 1, "successes": 3, "trials": 2}], ["line 1", "successes 3 of 2"]),
        ([{"step": 0, "prompt_id": 1, "successes": 1}], ["line 1", "'trials'"]),
        ([{"step": 0, "prompt_id": 1, "rewards": [1]}, {"step": 0, "prompt_id": "a", "rewards": [1]}], ["line 2", "text"]),
        ([{"step": 0, "prompt_id": 1, "rewards": [1]}, {"step": 0, "prompt_id": 2, "rewards": 1}], ["line 2", "rollout"]),
        (
            [{"step": 0, "prompt_id": 1, "rewards": [1]}, {"step": 0, "prompt_id": 2, "rewards": [0]}, {"step": 0, "prompt_id": 1, "rewards": [0]}],
            ["line 3", "seen twice in step 0", "line 1"],
        ),
    ],
)  # fmt: skip
def test_a_bad_jsonl_log_is_refused_naming_the_line(tmp_path, rows, words):
    with pytest.raises(LogError) as err:
        read_log(write_jsonl(tmp_path / "bad.jsonl", rows))
    for word in words:
        assert word in str(err.value), (word, str(err.value))
    assert "bad.jsonl" in str(err.value)


def test_a_line_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"step": 0, "prompt_id": 1, "rewards": [1]}\n\n{"step": 1,\n')
    with pytest.raises(LogError, match="line 3: not a JSON object"):
        read_log(path)


@pytest.mark.parametrize(
    ("table", "words"),
    [
        (pa.table({"step": [0], "prompt_id": [1]}), ["no column 'rewards'", "--reward-column"]),
        (pa.table({"prompt_id": [1], "rewards": [[1.0]]}), ["no column 'step'", "--step-column"]),
        (pa.table({"step": [0, 1], "prompt_id": [1, 1], "rewards": ["1", "0"]}), ["row 0", "not a number"]),
        (pa.table({"step": [0, 1, 2], "prompt_id": [1, 1, 1], "rewards": [[1.0], [0.0], [1.0, float("nan")]]}), ["row 2", "nan"]),
        (pa.table({"step": [0, 1, 2], "prompt_id": [1, 1, 1], "rewards": [[1.0], [0.0, None], [1.0]]}), ["row 1"]),
        (pa.table({"step": [0, None], "prompt_id": [1, 1], "rewards": [[1.0], [1.0]]}), ["row 1", "step is missing"]),
        (pa.table({"step": [0.0, 1.5], "prompt_id": [1, 1], "rewards": [[1.0], [1.0]]}), ["row 1", "whole number"]),
        (pa.table({"step": [0, 0], "prompt_id": [1, 1], "rewards": [[1.0], [0.0]]}), ["row 1", "seen twice", "row 0"]),
        (pa.table({"step": [0], "prompt_id": [1], "successes": [9], "trials": [8]}), ["row 0", "successes 9 of 8"]),
    ],
)  # fmt: skip
def test_a_bad_parquet_log_is_refused_naming_the_row(tmp_path, table, words):
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    with pytest.raises(LogError) as err:
        read_log(path)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"0": [0.5, 0.3]}, ["prompt '0', epoch 1", "multiple of 1/8", "--trials"]),
        ({"0": [0.5, 1.5]}, ["prompt '0', epoch 1", "in [0, 1]"]),
        ({"0": []}, ["prompt '0'", "non-empty"]),
        ([0.5], ["JSON object"]),
    ],
)
def test_a_bad_accuracy_file_is_refused_naming_the_entry(tmp_path, data, words):
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(data))
    with pytest.raises(LogError) as err:
        read_log(path)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_what_is_not_a_log_is_refused(tmp_path):
    with pytest.raises(LogError, match="no log at"):
        read_log(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(LogError, match="no rows"):
        read_log(tmp_path / "empty.jsonl")
    (tmp_path / "folder").mkdir()
    with pytest.raises(LogError, match=r"<step>\.jsonl"):
        read_log(tmp_path / "folder")


def test_many_rows_read_into_the_same_groups_from_both_formats(tmp_path):
    rng = np.random.default_rng(0)
    steps = np.repeat(np.arange(40), 25)
    ids = np.concatenate([rng.permutation(100)[:25] for _ in range(40)])
    rewards = rng.integers(0, 2, size=(1000, 4)).astype(float)
    rows = [
        {"step": int(s), "prompt_id": int(i), "rewards": r.tolist()}
        for s, i, r in zip(steps, ids, rewards, strict=True)
    ]
    a = read_log(write_jsonl(tmp_path / "a.jsonl", rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    b = read_log(tmp_path / "a.parquet")
    for field in ("steps", "prompts", "successes", "trials", "keys"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert int(a.successes.sum()) == int(rewards.sum())
