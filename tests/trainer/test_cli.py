"""`trainer-client` through its real parser: options, help, and the errors it prints instead of tracebacks.

Nothing here loads a model; the tests that reach the service stop at its answer to the first request."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from trainer_client import cli

ROOT = Path(__file__).resolve().parents[2]


def _parsed(*extra: str):
    return cli._build_configs(cli._parser().parse_args(["train", "--dataset", "d", "--task", "arithmetic",
                                                        "--metrics-out", "m.jsonl", *extra]))  # fmt: skip


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer_client.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.parametrize(
    ("value", "params"),
    [('{"eta": 2}', {"eta": 2}), ("{}", {}), ('{"candidate_ratio": null}', {"candidate_ratio": None})],
)
def test_params_take_a_json_object(value, params) -> None:
    assert _parsed("--params", value).strategy_params == params
    assert _parsed().strategy_params == {}


@pytest.mark.parametrize(
    ("value", "says"),
    [("[1, 2]", "is JSON but not an object"), ("null", "is JSON but not an object"),
     ("eta=2", "is not valid JSON"), ("{'eta': 2}", "is not valid JSON")],
)  # fmt: skip
def test_params_that_are_not_a_json_object_are_refused(value, says, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        _parsed("--params", value)
    assert exit_.value.code == cli.EXIT_CONFIG
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("trainer-client train: error: argument --params:")
    assert says in error and '{"eta": 2.0}' in error


def test_params_reach_the_service(service, tmp_path) -> None:
    """The service names the value it refuses: the object went through to /select."""
    result = _run("train", "--service-url", service.url, "--dataset", f"p-{uuid.uuid4().hex[:10]}",
                  "--task", "arithmetic", "--num-prompts", "4", "--batch-size", "2", "--rollouts", "2",
                  "--no-metadata", "--metrics-out", str(tmp_path / "m.jsonl"), "--strategy", "insight",
                  "--params", '{"eta": -1, "candidate_ratio": null}')  # fmt: skip
    assert result.returncode == cli.EXIT_SERVICE, result.stderr
    assert "Traceback" not in result.stderr
    assert "422" in result.stderr and "eta" in result.stderr


def test_the_default_strategy_is_the_decision_tables_row_for_the_run(capsys) -> None:
    """--strategy recommended (the default): uniform for a pool the run goes over again and again or
    knows nothing of; INSIGHT on uploaded rates for a pool larger than the run visits; what the user
    gives (--params, --filter, another strategy) wins."""
    from trainer_client.config import RECOMMENDED
    from trainer_client.metadata import TaskMetadata

    config = _parsed("--steps", "20", "--batch-size", "8")
    assert config.strategy == RECOMMENDED
    many = cli.recommended_config(config, 40, None)  # 4 visits
    said = capsys.readouterr().err
    assert (
        said.startswith("--strategy recommended: uniform for 40 prompts visited 4 times")
        and "What to run" in said
    )
    assert (many.strategy, many.strategy_params, many.select_filter) == ("uniform", {}, None)
    rates = TaskMetadata(pass_rate=[0.5] * 1000, group=None, pass_samples=[8] * 1000)
    few = cli.recommended_config(config, 1000, rates)  # 0.16 visits, rates of 8 samples
    assert (few.strategy, few.strategy_params) == ("insight", {"mu": 0.5})
    assert (
        cli.recommended_config(config, 1000, TaskMetadata(pass_rate=None, group=[0] * 1000)).strategy
        == "uniform"
    )
    mine = _parsed("--steps", "20", "--batch-size", "8", "--params", '{"mu": 0.3}', "--filter", "{}")
    chosen = cli.recommended_config(mine, 1000, rates)
    assert chosen.strategy_params == {"mu": 0.3} and chosen.select_filter == {}
    named = _parsed("--strategy", "dps")
    assert cli.recommended_config(named, 1000, rates) is named


def test_a_select_filter_reaches_the_service(service, tmp_path) -> None:
    """--filter is the select's filter object: the service names the bound it refuses, and an arm the
    filter cannot go with (greso) is refused with its reason; without --filter there is none."""
    assert _parsed("--filter", '{"recheck": 0.1}').select_filter == {"recheck": 0.1}
    assert _parsed("--filter", "{}").select_filter == {} and _parsed().select_filter is None
    for strategy, value, says in (("insight", '{"solved": 2}', "solved"), ("greso", "{}", "greso")):
        result = _run("train", "--service-url", service.url, "--dataset", f"f-{uuid.uuid4().hex[:10]}",
                      "--task", "arithmetic", "--num-prompts", "4", "--batch-size", "2", "--rollouts", "2",
                      "--no-metadata", "--metrics-out", str(tmp_path / "m.jsonl"), "--strategy", strategy,
                      "--filter", value)  # fmt: skip
        assert result.returncode == cli.EXIT_SERVICE, result.stderr
        assert "422" in result.stderr and says in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--strategy", "insigth"], "the service has no strategy 'insigth'; choose one of adarft, dps,"),
        (["--strategy", "insight", "--params", '{"etta": 2}'],
         "strategy 'insight' has no parameter(s) etta (--params); allowed: eta, mu,"),
    ],
)  # fmt: skip
def test_a_strategy_or_parameter_the_service_lacks_is_refused_before_anything_is_created(
    service, tmp_path, extra, says
) -> None:
    from rlvr_selector_client.client import SelectorClient

    name = f"s-{uuid.uuid4().hex[:10]}"
    result = _run("train", "--service-url", service.url, "--dataset", name, "--task", "arithmetic",
                  "--num-prompts", "4", "--batch-size", "2", "--rollouts", "2",
                  "--metrics-out", str(tmp_path / "m.jsonl"), *extra)  # fmt: skip
    assert result.returncode == cli.EXIT_SERVICE, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr
    with SelectorClient(service.url) as client:
        assert name not in client.list_datasets()  # no dataset left behind


def test_train_help_states_each_default_once(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--help"])
    assert exit_.value.code == 0
    options = capsys.readouterr().out.split("\noptions:", 1)[1]
    entries = {
        entry.split()[0]: " ".join(entry.split())
        for entry in re.split(r"\n(?=  -)|\n\n", options)
        if entry.strip()
    }
    twice = {flag: text for flag, text in entries.items() if text.count("(default") > 1}
    assert not twice
    assert "(default: None)" not in options and "(default: False)" not in options
    assert entries["--token"].endswith("(default: env SELECTOR_API_TOKEN; never printed)")
    assert entries["--gpu-memory-utilization"].endswith("vLLM memory share (default: 0.3)")
    assert entries["--seed"].endswith("(default: 0)") and entries["--steps"].endswith("(default: 20)")
    assert "(default" not in entries["--dataset"]  # required


def _write_metrics(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_plot_names_the_field_a_metrics_file_lacks(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    steps = [{"step": s, "mean_reward": 0.1 * s, "total_rollouts": 32 * (s + 1)} for s in range(3)]
    good = _write_metrics(tmp_path / "good.jsonl", steps)
    stripped = [{k: v for k, v in r.items() if k != "total_rollouts"} for r in steps]
    other = _write_metrics(tmp_path / "other.jsonl", steps[:1] + stripped[1:])
    out = tmp_path / "cmp.png"

    assert cli.main(["plot", str(good), str(other), "--out", str(out)]) == cli.EXIT_CONFIG
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "\n" not in error
    assert f"{other}, line 2 has no field 'total_rollouts'" in error
    assert "trainer-client train --metrics-out" in error
    assert not out.exists()

    _write_metrics(other, ["step 0", *steps[1:]])
    assert cli.main(["plot", str(other), "--out", str(out)]) == cli.EXIT_CONFIG
    assert f"{other}, line 1 is not a JSON object" in capsys.readouterr().err

    assert cli.main(["plot", str(good), "--out", str(out)]) == cli.EXIT_OK
    assert out.stat().st_size > 0


def test_train_says_when_the_service_wants_a_token_and_none_was_sent(start_service, tmp_path) -> None:
    token = "cli-token-" + uuid.uuid4().hex[:8]
    url = start_service(SELECTOR_API_TOKEN=token).url
    args = ["train", "--service-url", url, "--dataset", f"t-{uuid.uuid4().hex[:10]}", "--task", "arithmetic",
            "--num-prompts", "4", "--batch-size", "2", "--rollouts", "2", "--no-metadata",
            "--metrics-out", str(tmp_path / "m.jsonl"), "--strategy", "no-such-strategy"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "SELECTOR_API_TOKEN"}

    unsent = _run(*args, env=env)
    assert unsent.returncode == cli.EXIT_SERVICE and "Traceback" not in unsent.stderr
    assert f"the selector service at {url} requires a token and none was sent" in unsent.stderr

    wrong = _run(*args, "--token", "wrong", env=env)
    assert wrong.returncode == cli.EXIT_SERVICE and "rejected the token (HTTP 403)" in wrong.stderr

    from_env = _run(
        *args, env={**env, "SELECTOR_API_TOKEN": token}
    )  # past the token: the strategy is refused
    assert from_env.returncode == cli.EXIT_SERVICE and "no-such-strategy" in from_env.stderr
    assert token not in from_env.stderr + from_env.stdout


def test_rollout_budget_options_come_from_the_config_fields() -> None:
    config = _parsed("--rollout-budget", "48", "--rollouts-min", "3", "--rollouts-max", "16",
                     "--rollout-policy", "knapsack", "--group-weight", "rollout")  # fmt: skip
    assert (config.rollout_budget, config.rollouts_min, config.rollouts_max) == (48, 3, 16)
    assert config.rollout_policy == "knapsack" and config.grpo.group_weight == "rollout"
    plain = _parsed()
    assert plain.rollout_budget is None and plain.rollouts_min == 2 and plain.rollouts_max is None
    assert plain.rollout_policy == "posterior" and plain.grpo.group_weight == "prompt"
    from trainer_client.train import rollout_budget

    budget = rollout_budget(config)
    assert budget.to_json() == {"budget": 48, "min": 3, "max": 16, "policy": "knapsack"}
    assert rollout_budget(plain) is None


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--rollout-budget", "48", "--strategy", "dynamic_sampling"],
         "--strategy dynamic_sampling runs in the trainer and screens its own prompts with fixed group sizes"),
        (["--rollout-budget", "48", "--strategy", "speed_rl"], "--strategy speed_rl runs in the trainer"),
        (["--rollout-budget", "15"], "--rollout-budget 15 cannot give each of the 8 prompts --rollouts-min 2: "
         "raise it to at least 16"),
        (["--rollout-budget", "200", "--rollouts-max", "16"],
         "--rollout-budget 200 exceeds 8 prompts x --rollouts-max 16: lower it to at most 128"),
        (["--rollout-budget", "48", "--rollouts-min", "6", "--rollouts-max", "4"],
         "--rollouts-max 4 is below --rollouts-min 6"),
        (["--rollout-budget", "48", "--rollouts-min", "0"], "--rollouts-min must be >= 1"),
        (["--rollouts-max", "16"], "--rollouts-max applies only with --rollout-budget"),
        (["--rollout-policy", "knapsack", "--rollouts-min", "3"],
         "--rollouts-min, --rollout-policy apply only with --rollout-budget"),
    ],
)  # fmt: skip
def test_rollout_budgets_that_cannot_work_are_refused(extra, says) -> None:
    with pytest.raises(ValueError) as error:
        _parsed(*extra)
    assert says in str(error.value)


def test_a_refused_budget_exits_with_one_error_line_before_the_service_is_called(tmp_path) -> None:
    # port 9 (discard): nothing listens; the configuration is refused before any request
    result = _run("train", "--service-url", "http://127.0.0.1:9", "--dataset", "d", "--task", "arithmetic",
                  "--rollout-budget", "48", "--strategy", "dynamic_sampling",
                  "--metrics-out", str(tmp_path / "m.jsonl"))  # fmt: skip
    assert result.returncode == cli.EXIT_CONFIG and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--strategy dynamic_sampling" in errors[0]
    assert not (tmp_path / "m.jsonl").exists()


def test_a_budget_the_service_refuses_stops_at_the_first_select(service, tmp_path) -> None:
    """--rollouts-max above the service's K limit: the first select's 422, before any model loads."""
    result = _run("train", "--service-url", service.url, "--dataset", f"b-{uuid.uuid4().hex[:10]}",
                  "--task", "arithmetic", "--num-prompts", "4", "--batch-size", "2", "--rollouts", "2",
                  "--no-metadata", "--metrics-out", str(tmp_path / "m.jsonl"),
                  "--rollout-budget", "2050", "--rollouts-max", "2048")  # fmt: skip
    assert result.returncode == cli.EXIT_SERVICE, result.stderr
    assert "Traceback" not in result.stderr and "422" in result.stderr and "max" in result.stderr
