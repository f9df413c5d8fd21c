"""Profiling, a counted phase (trainer-client train --profile-samples N): through the CLI against a real
service, every prompt gets N rollouts with the run's own prompts, sampler settings and verifier, the
dataset's profiling rollouts are N x prompts, each prompt's prior is its measured rate, the run's records
carry the profile, and a resumed run does not profile again. Generation is faked at the engine (the seam
where a model would run); the task, its verifier, the prompt rendering and the service are real."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlvr_selector_client import SelectorClient
from trainer_client import cli
from trainer_client.model import encode_prompt
from trainer_client.rollout import Completion, PromptRollouts, RolloutEngine
from trainer_client.tasks import load_task
from trainer_client.train import Trainer

PROMPTS, SAMPLES = 6, 4


class _Started(Exception):
    """Stops the run where its first step would start, carrying the trainer."""


class ScriptedEngine(RolloutEngine):
    """Prompt i of the task gets i % (n + 1) right answers out of its n samples (so its rate is known),
    the rest a wrong one; records every call."""

    name = "scripted"

    def __init__(self, answers: dict[tuple[int, ...], tuple[int, str]]) -> None:
        self.answers, self.calls = answers, []

    def generate(self, prompts, *, n, max_new_tokens, temperature, top_p=1.0):
        self.calls.append((len(prompts), n, temperature))
        out = []
        for prompt in prompts:
            index, answer = self.answers[tuple(prompt)]
            texts = [f"Answer: {answer}" if j < index % (n + 1) else "Answer: nope" for j in range(n)]
            out.append(PromptRollouts(tuple(prompt), tuple(Completion((1,), t, "stop") for t in texts)))
        return out

    def sync_weights(self, named_tensors) -> None:  # pragma: no cover - no step runs
        raise AssertionError("profiling must not change the policy")


@pytest.fixture
def scripted(monkeypatch):
    """cli._build_trainer gives a Trainer over the run's own task with a ScriptedEngine (no model), and
    Trainer.run stops before the first step."""
    from tests.integrations.frameworks.common import tokenizer

    tok = tokenizer()
    task = load_task("arithmetic", num_prompts=PROMPTS, seed=0)
    answers = {
        encode_prompt(tok, p.prompt, task.system_prompt): (i, p.answer) for i, p in enumerate(task.problems)
    }
    assert len(answers) == PROMPTS  # every prompt renders to its own token ids
    engines: list[ScriptedEngine] = []

    def build_trainer(args, config, client, info, task):
        engines.append(ScriptedEngine(answers))
        return Trainer(
            config,
            client=client,
            dataset_info=info,
            task=task,
            tokenizer=tok,
            engine=engines[-1],
            learner=None,
        )

    def run(self, sink, *, progress=True, on_record=None):
        raise _Started(self)

    monkeypatch.setattr(cli, "_build_trainer", build_trainer)
    monkeypatch.setattr(Trainer, "run", run)
    return engines


def _train(url: str, dataset: str, tmp_path: Path, *extra: str) -> Trainer:
    args = [
        "train", "--service-url", url, "--dataset", dataset, "--task", "arithmetic", "--num-prompts",
        str(PROMPTS), "--batch-size", "2", "--rollouts", "4", "--strategy", "uniform", "--temperature", "0.7",
        "--metrics-out", str(tmp_path / "m.jsonl"), "--no-progress", *extra,
    ]  # fmt: skip
    with pytest.raises(_Started) as started:
        cli.main(args)
    return started.value.args[0]


def test_a_profile_costs_n_rollouts_per_prompt_and_sets_each_prior(
    service, tmp_path, scripted, capsys
) -> None:
    dataset = f"p-{uuid.uuid4().hex[:10]}"
    trainer = _train(service.url, dataset, tmp_path, "--profile-samples", str(SAMPLES))
    (engine,) = scripted
    # B x K = 8 sequences per engine call, as a training step's: 2 prompts of 4 samples each
    assert engine.calls == [(2, SAMPLES, 0.7)] * 3
    expected = [(i % (SAMPLES + 1)) / SAMPLES for i in range(PROMPTS)]
    with SelectorClient(service.url) as client:
        summary = client.get_dataset(dataset).raw["summary"]
        priors = [b.prior_pass_rate for b in client.beliefs(dataset, list(range(PROMPTS))).beliefs]
    assert summary["profile_rollouts"] == SAMPLES * PROMPTS == 24
    assert summary["total_rollouts"] == 24 and summary["prompts_with_pass_samples"] == PROMPTS
    assert priors == pytest.approx(expected)
    assert trainer.profile_rollouts == 24
    err = capsys.readouterr().err
    assert f"profile: {PROMPTS} prompts x {SAMPLES} samples = 24 rollouts" in err
    assert "the dataset's profiling rollouts: 24" in err

    again = _train(service.url, dataset, tmp_path, "--profile-samples", str(SAMPLES))  # a resumed run
    assert scripted[-1].calls == [] and again.profile_rollouts == 24
    assert "already holds 24 profiling rollouts; not profiling again" in capsys.readouterr().err


def test_a_reference_pass_given_as_a_file_counts_only_when_it_was_rolled_out_for_the_run(
    service, tmp_path, scripted
) -> None:
    rates = tmp_path / "rates.jsonl"
    rates.write_text("".join(f'{{"pass_rate": {r}, "pass_samples": 8}}\n' for r in (0, 0.5, 1, 0.25, 0, 1)))
    shipped, profiled = f"p-{uuid.uuid4().hex[:10]}", f"p-{uuid.uuid4().hex[:10]}"
    assert _train(service.url, shipped, tmp_path, "--pass-rates", str(rates)).profile_rollouts == 0
    trainer = _train(service.url, profiled, tmp_path, "--pass-rates", str(rates), "--pass-rates-profiled")
    assert trainer.profile_rollouts == 48
    assert all(engine.calls == [] for engine in scripted)  # no profiling pass of its own
    with SelectorClient(service.url) as client:
        assert client.get_dataset(shipped).raw["summary"]["prompts_with_pass_samples"] == PROMPTS
        assert client.get_dataset(profiled).raw["summary"]["profile_rollouts"] == 48


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--profile-samples", "1"], "--profile-samples must be 2..16 (got 1)"),
        (["--profile-samples", "17"], "--profile-samples must be 2..16 (got 17)"),
        (["--profile-samples", "4", "--strategy", "dynamic_sampling"], "never reads them"),
        (["--profile-samples", "4", "--no-metadata"], "--profile-samples uploads metadata"),
        (["--profile-samples", "4", "--pass-rates", "r.json"], "--profile-samples measures"),
        (["--pass-rates-profiled"], "give --pass-rates"),
    ],
)
def test_a_profile_that_cannot_work_is_refused_before_anything_is_created(
    service, tmp_path, extra, says, capsys
):
    dataset = f"p-{uuid.uuid4().hex[:10]}"
    args = [
        "train", "--service-url", service.url, "--dataset", dataset, "--task", "arithmetic", "--num-prompts",
        "4", "--batch-size", "2", "--metrics-out", str(tmp_path / "m.jsonl"), *extra,
    ]  # fmt: skip
    assert cli.main(args) == 2
    assert says in capsys.readouterr().err
    with SelectorClient(service.url) as client:
        assert dataset not in client.list_datasets()
