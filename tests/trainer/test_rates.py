"""rlvr_selector_client.rates: each shipped format reads to per-prompt rates with the samples behind them,
a bad file is refused naming the entry before anything is sent, and the command line imports into a real
service as free rates or as a counted profile.

tests/trainer/data/nemo_gym/rollouts_reward_profiling.jsonl and fanout_reward_profiling.jsonl were written
by NeMo-Gym 0.7.0's own `gym eval profile` (nemo_gym/cli/eval.py `reward_profile`, writing through
nemo_gym/reward_profile.py `RewardProfiler.write_to_disk`), run in a scratch Python 3.13 venv outside the
repository (nemo-gym needs Python >= 3.13.14 and ray, which this venv does not have):

    gym eval profile --inputs inputs.jsonl --rollouts rollouts.jsonl ++allow_partial_rollouts=True

over the inputs.jsonl and rollouts.jsonl beside it (5 tasks x 4 rollouts asked; task 3 got none, task 4
three of its four; binary rewards), and for the fan-out file over 2 tasks whose 4 rollouts two agents
share (one profile row per task and agent)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rlvr_selector_client import rates as rt

NEMO = Path(__file__).parent / "data" / "nemo_gym"


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _parquet(path: Path, records: list[dict]) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def _skywork(d7: list[int | None]) -> list[dict]:
    """Rows shaped as Skywork-OR1-RL-Data's (its card's features: data_source, prompt, ability,
    reward_model, extra_info.index, extra_info.model_difficulty.<3 models>)."""
    return [
        {
            "data_source": "train-math-deepscaler",
            "prompt": [{"role": "user", "content": f"problem {i}"}],
            "ability": "math",
            "reward_model": {"ground_truth": '["1"]', "style": "rule"},
            "extra_info": {
                "index": i,
                "model_difficulty": {
                    "DeepSeek-R1-Distill-Qwen-1.5B": 16,
                    "DeepSeek-R1-Distill-Qwen-32B": 0,
                    "DeepSeek-R1-Distill-Qwen-7B": d,
                },
            },
        }
        for i, d in enumerate(d7)
    ]


# --------------------------------------------------------------------------------------------------
# Each format
# --------------------------------------------------------------------------------------------------


def test_a_column_with_its_counts_reads_as_rates_from_their_samples(tmp_path) -> None:
    path = _jsonl(
        tmp_path / "r.jsonl",
        [
            {"pass_rate": 0.25, "pass_samples": 8},
            {"pass_rate": None, "pass_samples": 8},
            {"pass_rate": 1, "pass_samples": 4},
        ],
    )
    rates = rt.read_rates(path, size=3)
    assert (rates.format, rates.pass_rate, rates.pass_samples) == ("column", [0.25, None, 1.0], [8, None, 4])
    assert rates.known == 2 and rates.samples == 12 and rates.counted
    nested = _jsonl(tmp_path / "n.jsonl", [{"extra_info": {"rate": 0.5}}, {"extra_info": {"rate": 0.0}}])
    plain = rt.read_rates(nested, column="extra_info.rate", samples=16)
    assert (plain.pass_rate, plain.pass_samples) == ([0.5, 0.0], [16, 16])
    uncounted = rt.read_rates(nested, column="extra_info.rate")
    assert uncounted.pass_samples == [None, None] and not uncounted.counted


def test_a_parquet_column_reads_without_loading_the_other_columns(tmp_path) -> None:
    path = _parquet(
        tmp_path / "r.parquet", [{"prompt": "x" * 100, "score": 0.125}, {"prompt": "y", "score": None}]
    )
    rates = rt.read_rates(path, column="score", samples=8)
    assert (rates.pass_rate, rates.pass_samples) == ([0.125, None], [8, None])


def test_a_json_array_is_the_trainers_pass_rates_file(tmp_path) -> None:
    path = tmp_path / "r.json"
    path.write_text("[0.5, null, 0, 1]")
    rates = rt.read_rates(path, samples=16)
    assert (rates.format, rates.pass_rate, rates.pass_samples) == (
        "array",
        [0.5, None, 0.0, 1.0],
        [16, None, 16, 16],
    )


@pytest.mark.parametrize("container", ["jsonl", "parquet"])
def test_skywork_counts_failures_out_of_16_for_the_chosen_model(tmp_path, container) -> None:
    records = _skywork([0, 4, 16, None])
    path = (
        _jsonl(tmp_path / "s.jsonl", records)
        if container == "jsonl"
        else _parquet(tmp_path / "s.parquet", records)
    )
    rates = rt.read_rates(path)  # told apart by extra_info.model_difficulty; the 7B model by default
    assert rates.format == "skywork"
    assert rates.pass_rate == [1.0, 0.75, 0.0, None] and rates.pass_samples == [16, 16, 16, None]
    small = rt.read_rates(path, format="skywork", model="DeepSeek-R1-Distill-Qwen-1.5B")  # a dot in the key
    assert small.pass_rate == [0.0] * 4 and small.pass_samples == [16] * 4


def test_polaris_difficulty_is_a_pass_rate_out_of_8(tmp_path) -> None:
    records = [{"problem": "p", "answer": "1", "difficulty": d} for d in ("0/8", "3/8", "7/8")]
    rates = rt.read_rates(_jsonl(tmp_path / "p.jsonl", records))
    assert rates.format == "polaris"
    assert rates.pass_rate == [0.0, 0.375, 0.875] and rates.pass_samples == [8, 8, 8]


def test_a_nemo_gym_reward_profile_gives_each_task_its_mean_reward_from_its_rollouts() -> None:
    path = NEMO / "rollouts_reward_profiling.jsonl"
    rates = rt.read_rates(path, size=6)  # task 3 had no rollouts (no row), task 5 was never profiled
    assert rates.format == "nemo-gym"
    assert rates.pass_rate == pytest.approx([1.0, 0.25, 0.0, None, 2 / 3, None])
    assert rates.pass_samples == [4, 4, 4, None, 3, None]
    assert len(rt.read_rates(path)) == 5  # without a dataset size: up to the last task


# --------------------------------------------------------------------------------------------------
# Bad files
# --------------------------------------------------------------------------------------------------


BAD = [
    ("r.jsonl", [{"pass_rate": 0.5}, {"pass_rate": 1.5}], {}, r"line 2 \(prompt 1\): pass_rate 1.5 must lie in \[0, 1\]"),
    ("r.jsonl", [{"pass_rate": 0.5}, {"pass_rate": "0.5"}], {}, r"line 2 \(prompt 1\): pass_rate '0.5' must be a number"),
    ("r.jsonl", [{"pass_rate": 0.5, "pass_samples": 8}, {"pass_rate": 0.5, "pass_samples": 0}], {}, r"line 2 \(prompt 1\): pass_samples 0 must lie in 1\.\."),
    ("r.jsonl", [{"pass_rate": 0.5, "pass_samples": 8}, {"pass_rate": 0.5}], {}, r"line 2 \(prompt 1\) has no column 'pass_samples'"),
    ("r.jsonl", [{"pass_rate": 0.5}, {"rate": 0.5}], {}, r"line 2 \(prompt 1\) has no column 'pass_rate'"),
    ("r.jsonl", [{"score": 0.5}], {}, "cannot tell which column holds the pass rates.*--column"),
    ("r.jsonl", [{"pass_rate": 0.5}], {"size": 2}, "has 1 prompts for a dataset of 2"),
    ("r.jsonl", [{"pass_rate": 0.5}], {"format": "csv"}, "unknown format 'csv'"),
    ("r.jsonl", [{"pass_rate": 0.5}], {"samples": 0}, r"--samples: the sample count 0 must lie in 1\.\."),
    ("s.jsonl", _skywork([3, 17]), {}, r"line 2 \(prompt 1\): extra_info.model_difficulty.DeepSeek-R1-Distill-Qwen-7B 17 must be"),
    ("s.jsonl", _skywork([3]), {"model": "Qwen-72B"}, r"has no column .*its models: DeepSeek-R1-Distill-Qwen-1.5B"),
    ("p.jsonl", [{"difficulty": "3/8"}, {"difficulty": "9/8"}], {}, r"line 2 \(prompt 1\): difficulty '9/8' must be"),
    ("r.json", {"0": 0.5}, {}, "must hold a JSON array"),
    ("r.json", [0.5, True], {}, "entry 1: pass rate True must be a number"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "content", "options", "message"), BAD)
def test_a_bad_file_is_refused_naming_the_entry(tmp_path, name, content, options, message) -> None:
    path = tmp_path / name
    if name.endswith(".json"):
        path.write_text(json.dumps(content))
    else:
        _jsonl(path, content)
    with pytest.raises(rt.RatesError, match=message):
        rt.read_rates(path, **options)


def test_a_bad_nemo_gym_profile_is_refused_naming_the_row(tmp_path) -> None:
    with pytest.raises(
        rt.RatesError, match=r"line 2: task 0 is profiled twice \(first at line 1\).*one agent"
    ):
        rt.read_rates(NEMO / "fanout_reward_profiling.jsonl")
    with pytest.raises(rt.RatesError, match=r"line 4: task 4 is beyond the dataset's 4 prompts"):
        rt.read_rates(NEMO / "rollouts_reward_profiling.jsonl", size=4)
    rows = [json.loads(line) for line in (NEMO / "rollouts_reward_profiling.jsonl").read_text().splitlines()]
    rows[1]["mean/reward"] = 3.0  # a reward that is not a pass rate
    with pytest.raises(rt.RatesError, match=r"line 2 \(task 1\): mean/reward 3.0 must lie in \[0, 1\]"):
        rt.read_rates(_jsonl(tmp_path / "x_reward_profiling.jsonl", rows))


def test_the_client_package_imports_without_pyarrow_until_a_parquet_file_is_read(tmp_path) -> None:
    path = _jsonl(tmp_path / "r.jsonl", [{"pass_rate": 0.5}])
    code = (
        "import sys; import rlvr_selector_client.rates as rt; "
        f"rt.read_rates({str(path)!r}); print('pyarrow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------------------------------
# The command line against a real service
# --------------------------------------------------------------------------------------------------


def _summary(url: str, dataset: str) -> dict:
    from rlvr_selector_client import SelectorClient

    with SelectorClient(url) as client:
        return client.get_dataset(dataset).raw["summary"]


def test_import_uploads_shipped_rates_free_and_a_profile_counted(service, tmp_path, capsys) -> None:
    from rlvr_selector_client import SelectorClient

    free, counted = f"r-{uuid.uuid4().hex[:10]}", f"r-{uuid.uuid4().hex[:10]}"
    with SelectorClient(service.url) as client:
        for name in (free, counted):
            client.create_dataset(name, 4)
    polaris = _jsonl(tmp_path / "p.jsonl", [{"difficulty": d} for d in ("0/8", "3/8", "8/8", "1/8")])
    url = ["--service-url", service.url]
    assert rt.main(["check", str(polaris)]) == 0  # reads and summarises: nothing sent
    assert (
        "(polaris): 4 prompts, 4 with a rate (mean 0.375; 1 at 0, 1 at 1), 32 samples"
        in capsys.readouterr().out
    )
    assert _summary(service.url, free)["prompts_with_pass_rate"] == 0
    assert rt.main(["import", str(polaris), "--dataset", free, *url]) == 0
    assert "free: they came with the data" in capsys.readouterr().out
    shipped = _summary(service.url, free)
    assert shipped["prompts_with_pass_rate"] == 4 and shipped["prompts_with_pass_samples"] == 4
    assert shipped["profile_rollouts"] == 0
    with SelectorClient(service.url) as client:
        assert [b.prior_pass_rate for b in client.beliefs(free, [0, 1, 2, 3]).beliefs] == [
            0.0,
            0.375,
            1.0,
            0.125,
        ]

    profile = _jsonl(
        tmp_path / "q.jsonl", [{"pass_rate": r, "pass_samples": 4} for r in (0.0, 0.25, 0.5, 1.0)]
    )
    assert rt.main(["import", str(profile), "--dataset", counted, "--profile", *url]) == 0
    assert "16 profiling rollouts" in capsys.readouterr().out
    summary = _summary(service.url, counted)
    assert summary["profile_rollouts"] == 16 and summary["total_rollouts"] == 16


def test_import_refuses_a_bad_file_or_length_and_uploads_nothing(service, tmp_path, capsys) -> None:
    from rlvr_selector_client import SelectorClient

    dataset = f"r-{uuid.uuid4().hex[:10]}"
    with SelectorClient(service.url) as client:
        client.create_dataset(dataset, 3)
    url = ["--service-url", service.url, "--dataset", dataset]
    late = _jsonl(tmp_path / "late.jsonl", [{"pass_rate": 0.5}, {"pass_rate": 0.5}, {"pass_rate": -0.5}])
    short = _jsonl(tmp_path / "short.jsonl", [{"pass_rate": 0.5}, {"pass_rate": 0.5}])
    uncounted = _jsonl(tmp_path / "u.jsonl", [{"pass_rate": 0.5}] * 3)
    for argv, says in (
        ([str(late)], r"line 3 (prompt 2): pass_rate -0.5 must lie in [0, 1]"),
        ([str(short)], "has 2 prompts for a dataset of 3"),
        ([str(short), "--offset", "2"], "2 prompts from --offset 2 run past the dataset's 3 prompts"),
        ([str(uncounted), "--profile"], "--profile counts the samples behind each rate"),
        ([str(tmp_path / "none.jsonl")], "cannot be read"),
    ):
        assert rt.main(["import", *argv, *url]) == 2
        err = capsys.readouterr().err
        assert says in err and "nothing was uploaded" in err and "Traceback" not in err
    assert _summary(service.url, dataset)["prompts_with_pass_rate"] == 0
    assert rt.main(["import", str(short), *url[:2], "--dataset", "no-such-dataset"]) == 3
    assert "create it first" in capsys.readouterr().err
    assert rt.main(["import", str(short), "--offset", "1", *url]) == 0  # prompts 1 and 2
    assert _summary(service.url, dataset)["prompts_with_pass_rate"] == 2
