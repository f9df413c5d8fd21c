"""What the trainer client tells the service about its tasks' prompts (trainer_client/metadata.py):
arithmetic and Countdown tiers as groups, JSONL `pass_rate` / `group` fields, and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_client.metadata import task_metadata
from trainer_client.tasks import load_task


def _jsonl(tmp_path: Path, records: list[dict]) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"q{i}?", "answer": "1", **r}) + "\n" for i, r in enumerate(records))
    )
    return str(path)


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_procedural_tiers_are_the_groups(name):
    task = load_task(name, num_prompts=30, seed=3)
    meta = task_metadata(task)
    assert meta.pass_rate is None
    assert meta.group == [p.meta["tier"] for p in task.problems]
    assert len(set(meta.group)) > 1


def test_jsonl_pass_rates_and_numeric_groups(tmp_path):
    records = [{"pass_rate": 0.25, "group": 3}, {"pass_rate": None}, {"group": 0}, {}]
    meta = task_metadata(load_task("jsonl", num_prompts=4, seed=0, data=_jsonl(tmp_path, records)))
    assert meta.pass_rate == [0.25, None, None, None]
    assert meta.group == [3, -1, 0, -1] and meta.group_names == {}


def test_jsonl_string_groups_are_numbered_in_sorted_order(tmp_path):
    records = [{"group": "Geometry"}, {"group": "Algebra"}, {}, {"group": "Geometry"}]
    meta = task_metadata(load_task("jsonl", num_prompts=4, seed=0, data=_jsonl(tmp_path, records)))
    assert meta.group == [1, 0, -1, 1] and meta.group_names == {0: "Algebra", 1: "Geometry"}
    assert meta.pass_rate is None


def test_a_jsonl_file_without_metadata_has_none(tmp_path):
    meta = task_metadata(load_task("jsonl", num_prompts=2, seed=0, data=_jsonl(tmp_path, [{}, {}])))
    assert meta.empty


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([{"pass_rate": 1.5}], r"data.jsonl:1: pass_rate 1.5 must lie in \[0, 1\]"),
        ([{}, {"pass_rate": "high"}], r"data.jsonl:2: pass_rate 'high' must be a number"),
        ([{"group": 70000}], r"data.jsonl:1: group 70000 must be an integer in 0..65535"),
        ([{"group": -1}], "group -1"),
        ([{"group": True}], "group True"),
        ([{"group": "a"}, {"group": 2}], "mix strings and numbers"),
    ],
)
def test_bad_jsonl_metadata_names_the_line(tmp_path, records, message):
    task = load_task("jsonl", num_prompts=len(records), seed=0, data=_jsonl(tmp_path, records))
    with pytest.raises(ValueError, match=message):
        task_metadata(task)


def test_the_tasks_own_groups_and_a_records_group_field_wins(tmp_path):
    levels = [{"level": "Level 2"}, {"level": "Level 5"}, {"level": "Level 2", "group": 7}]
    task = load_task("jsonl", num_prompts=3, seed=0, data=_jsonl(tmp_path, levels))
    assert [p.group for p in task.problems] == [2, 5, 2]  # MATH levels become the task's groups
    assert task_metadata(task).group == [2, 5, 7]


def test_reasoning_gym_levels_are_the_groups():
    pytest.importorskip("reasoning_gym")
    task = load_task("rg:chain_sum:0-2", num_prompts=9, seed=0)
    assert task_metadata(task).group == [p.group for p in task.problems]
    assert set(task_metadata(task).group) == {0, 1, 2}


@pytest.mark.parametrize(
    ("records", "option", "uploaded", "expected"),
    [
        ([{"pass_rate": 0.25}, {}], None, True, 16.0),  # reference rates: weighed as 16 samples
        ([{"group": 1}, {}], None, True, None),  # groups only: the service's default
        ([{"pass_rate": 0.25}, {}], 4.0, True, 4.0),  # the option wins
        ([{"pass_rate": 0.25}, {}], None, False, None),  # nothing uploaded (--no-metadata): the default
    ],
)
def test_the_trainer_weighs_uploaded_pass_rates_as_a_reference_measurement(
    tmp_path, records, option, uploaded, expected
):
    from trainer_client.cli import REFERENCE_PRIOR_STRENGTH, prior_strength

    assert REFERENCE_PRIOR_STRENGTH == 16.0
    task = load_task("jsonl", num_prompts=2, seed=0, data=_jsonl(tmp_path, records))
    assert prior_strength(option, task_metadata(task) if uploaded else None) == expected


def _rates_file(tmp_path: Path, content: str) -> str:
    path = tmp_path / "rates.json"
    path.write_text(content)
    return str(path)


def test_pass_rates_from_a_file_of_their_own_replace_the_records(tmp_path):
    """--pass-rates gives a built-in task (whose records carry none) reference rates, keeps its groups,
    and replaces a JSONL record's own field."""
    import argparse

    from trainer_client.cli import _task_metadata

    task = load_task("arithmetic:0,3", num_prompts=4, seed=0)
    args = argparse.Namespace(no_metadata=False, pass_rates=_rates_file(tmp_path, "[0.5, null, 0, 1]"))
    meta = _task_metadata(args, task)
    assert meta.pass_rate == [0.5, None, 0.0, 1.0]
    assert meta.group == task_metadata(task).group and set(meta.group) == {0, 3}
    jsonl = load_task("jsonl", num_prompts=2, seed=0, data=_jsonl(tmp_path, [{"pass_rate": 0.9}, {}]))
    args.pass_rates = _rates_file(tmp_path, "[0.125, 0.25]")
    assert _task_metadata(args, jsonl).pass_rate == [0.125, 0.25]
    args.pass_rates = _rates_file(tmp_path, "[null, null]")  # nothing known: no rates, no reference defaults
    assert _task_metadata(args, jsonl).pass_rate is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[0.5, 0.5]", "has 2 prompts for a dataset of 3"),
        ('{"0": 0.5}', "must hold a JSON array .*, got dict"),
        ("[0.5, 1.5, 0]", r"entry 1: pass rate 1.5 must lie in \[0, 1\]"),
        ('[0.5, "0.1", 0]', r"entry 1: pass rate '0.1' must be a number in \[0, 1\] or null"),
        ("[0.5, true, 0]", "entry 1: pass rate True must be a number"),
        ("[0.5, NaN, 0]", "entry 1: pass rate nan must be a number"),
        ("[0.5, 0.5", "is not valid JSON"),
        (None, "cannot be read"),
    ],
)
def test_a_bad_pass_rates_file_refuses_the_run_naming_the_entry(tmp_path, content, message):
    import argparse

    from trainer_client.cli import EXIT_CONFIG, _CliError, _task_metadata

    task = load_task("arithmetic", num_prompts=3, seed=0)
    path = str(tmp_path / "missing.json") if content is None else _rates_file(tmp_path, content)
    with pytest.raises(_CliError, match=message) as refused:
        _task_metadata(argparse.Namespace(no_metadata=False, pass_rates=path), task)
    assert refused.value.code == EXIT_CONFIG and "--pass-rates" in str(refused.value)
    with pytest.raises(_CliError, match="--no-metadata"):
        _task_metadata(argparse.Namespace(no_metadata=True, pass_rates=path), task)


@pytest.mark.parametrize(
    ("strategy", "given", "records", "uploaded", "expected"),
    [
        ("insight", {}, [{"pass_rate": 0.25}, {}], True, {"mu": 0.5}),  # reference rates: centred at 0.5
        ("insight", {"mu": 0.3, "eta": 2.0}, [{"pass_rate": 0.25}, {}], True, {"mu": 0.3, "eta": 2.0}),
        ("insight", {"eta": 2.0}, [{"pass_rate": 0.25}, {}], True, {"eta": 2.0, "mu": 0.5}),
        ("insight", {}, [{"group": 1}, {}], True, {}),  # groups only: the service's default
        ("insight", {}, [{"pass_rate": 0.25}, {}], False, {}),  # nothing uploaded (--no-metadata)
        ("mopps", {}, [{"pass_rate": 0.25}, {}], True, {}),  # other strategies keep theirs
    ],
)
def test_insight_is_centred_where_groups_are_mixed_when_prompts_carry_reference_rates(
    tmp_path, strategy, given, records, uploaded, expected
):
    from trainer_client.cli import REFERENCE_INSIGHT_MU, strategy_params
    from trainer_client.config import TrainConfig

    assert REFERENCE_INSIGHT_MU == 0.5
    task = load_task("jsonl", num_prompts=2, seed=0, data=_jsonl(tmp_path, records))
    config = TrainConfig(dataset="d", strategy=strategy, strategy_params=dict(given))
    assert strategy_params(config, task_metadata(task) if uploaded else None) == expected
    assert config.strategy_params == given  # the config it was given is left alone
