"""`selector-service replay` end to end: One-Shot-RLVR's per-epoch accuracy file through a service of its
own (embedded store), its JSON line as specified, and the arms it shares with bench/rollout_trace.py (which
replays through the selection core directly) epoch for epoch the same; a bad log exits 3 and writes
nothing; outputs appear whole or not at all."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import numpy as np
import pytest

from selector_service.replay import command
from selector_service.replay.arms import arm_names
from selector_service.replay.logs import read_log
from selector_service.replay.protocol import LatestOutcomeFilterArm, epochs_of, replay
from selector_service.server import cli
from tests.replay import ROOT, one_shot_trace

TRACE = one_shot_trace()
ARMS = [
    "uniform",
    "filter",
    "filter_reprofile",
    "filter_latest_outcome",
    "insight",
    "insight+profile",
    "greso",
]
PROFILED = ["filter", "filter_reprofile", "filter_latest_outcome", "insight+profile"]
SHARED = ["uniform", "insight", "greso"]  # rollout_trace picks with the core's strategy, K = the trace's
EPOCHS, BATCH = 6, 64


def _rollout_trace():
    spec = importlib.util.spec_from_file_location("rollout_trace", ROOT / "bench" / "rollout_trace.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["rollout_trace"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(TRACE is None, reason="One-Shot-RLVR's acc_step_500.json is not in a shared/data folder")
def test_the_one_shot_trace_replays_and_matches_the_core_replay(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "replay",
        str(TRACE),
        "--epochs",
        str(EPOCHS),
        "--batch-size",
        str(BATCH),
        "--arms",
        ",".join(ARMS),
    ]
    assert cli.main([*argv, "--out", str(out), "--no-progress"]) == 0
    stdout = capsys.readouterr().out
    line = json.loads(stdout.strip().splitlines()[-1])
    assert set(line) == {"epochs", "prompts", "batch_size", "arms", "recommended"}
    assert (line["epochs"], line["prompts"], line["batch_size"]) == (EPOCHS, 1209, BATCH)
    assert list(line["arms"]) == ARMS
    for values in line["arms"].values():
        assert set(values) == {"esr", "esr_last", "effective_per_rollout"}
    # The log goes over its prompts again and again (every prompt once an epoch): the decision table's row
    # for such a run, whatever the profile.
    assert line["recommended"] == "uniform"
    assert "| filter_reprofile |" in stdout and "(the run itself" in stdout
    detail = json.loads((out / "replay.json").read_text())
    # The profile's rollouts as the service counted them (its dataset's profile_rollouts), the same number
    # as epoch 0's: 1,209 prompts x 8.
    for arm in ARMS:
        assert detail["arms"][arm]["profile_rollouts"] == (1209 * 8 if arm in PROFILED else 0), arm
    assert (out / "replay.png").stat().st_size > 10_000
    assert sorted(p.name for p in out.iterdir()) == ["replay.json", "replay.png"]  # no temporary left
    # The arms rollout_trace shares: its fixed-K row at K = 8 (each pick's real group) with the arm's
    # strategy picking B, seed 0, mixed groups epoch by epoch.
    trace = _rollout_trace()
    for arm in SHARED:
        report = trace.main(
            [str(TRACE), "--k", "8", "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--strategy", arm,
             "--seeds", "1", "--no-plot", "--out", str(tmp_path / arm)]
        )  # fmt: skip
        bench = report["results"]["K=8"]["summary"]["fixed"]["mixed_curve"]
        ours = [round(x * BATCH) for x in detail["arms"][arm]["esr_per_epoch"]]
        assert ours == [round(x) for x in bench], arm


def test_a_bad_log_exits_3_naming_the_line_and_writes_nothing(tmp_path, capsys):
    log = tmp_path / "run.jsonl"
    log.write_text(
        '{"step": 0, "prompt_id": 1, "rewards": [1, 0]}\n{"step": 0, "prompt_id": 2, "rewards": [1, "?"]}\n'
    )
    out = tmp_path / "out"
    assert cli.main(["replay", str(log), "--out", str(out), "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert "run.jsonl: line 2" in err and "not a number" in err
    assert not out.exists()
    # One epoch is not enough either.
    log.write_text('{"step": 0, "prompt_id": 1, "rewards": [1, 0]}\n')
    assert cli.main(["replay", str(log), "--out", str(out)]) == 3
    assert "at least two" in capsys.readouterr().err and not out.exists()


def test_outputs_appear_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    log = read_log(_small_log(tmp_path))
    table = epochs_of(log)
    results = replay(table, [LatestOutcomeFilterArm(0)], 4)
    args = argparse.Namespace(no_plot=False, seed=0)
    out = tmp_path / "out"

    def broken_plot(*_args, **_kwargs):
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(command, "plot", broken_plot)
    with pytest.raises(RuntimeError, match="disk is full"):
        command._report(args, log, table, 4, 2, results, out)
    assert list(out.iterdir()) == []  # the JSON written beside it was removed, not left half-done
    monkeypatch.undo()
    assert command._report(args, log, table, 4, 2, results, out) == 0
    assert sorted(p.name for p in out.iterdir()) == ["replay.json", "replay.png"]
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(line["arms"]) == ["filter_latest_outcome"] and line["recommended"] == "uniform"


def test_arms_are_chosen_by_name_and_strategy_filter_is_the_baselines():
    baselines = ["uniform", "filter", "filter_reprofile", "filter_latest_outcome"]
    names = arm_names(["uniform", "insight", "filter", "greso"])
    assert names == [*baselines, "uniform+profile", "insight", "insight+profile", "greso", "greso+profile"]
    assert arm_names(["insight", "filter"], with_filter=True) == [
        *baselines, "insight", "insight+profile", "insight+filter", "insight+profile+filter"
    ]  # fmt: skip
    assert command._choose("insight+profile,uniform", names) == ["uniform", "insight+profile"]
    with pytest.raises(command._Refused, match="unknown arm bogus: the arms are uniform, filter"):
        command._choose("uniform,bogus", names)
    with pytest.raises(command._Refused, match=r"insight\+filter \(give --filter"):
        command._choose("insight+filter", names)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("{", "--filter is not JSON"),
        ("[0.3]", "must be a JSON object"),
        ('{"bounds": 0.3}', "unknown filter setting"),
        ('{"solved": 2}', "solved"),
    ],
)
def test_a_bad_filter_option_exits_3(tmp_path, capsys, value, words):
    out = tmp_path / "out"
    argv = ["replay", str(_small_log(tmp_path)), "--filter", value, "--out", str(out), "--no-plot"]
    assert cli.main(argv) == 3
    assert words in capsys.readouterr().err and not out.exists()


def _small_log(tmp_path):
    rng = np.random.default_rng(0)
    rows = [
        {"step": e, "prompt_id": i, "rewards": rng.integers(0, 2, 4).tolist()}
        for e in range(4)
        for i in range(8)
    ]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_help_states_the_protocol(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["replay", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("epoch by epoch", "before it sees the epoch", "The first epoch is the profile", "GET /strategies",
                  "filter_reprofile", "filter_latest_outcome", "NAME+profile", "NAME+filter",
                  "docs/strategies.md"):  # fmt: skip
        assert words in text, words
