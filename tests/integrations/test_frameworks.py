"""The adapters driven by the trainer frameworks' own code, each framework in its own cached venv.

Each test builds (or reuses) the framework's venv (tests/integrations/frameworks/venvs.py: the framework from PyPI
with --no-deps, CPU torch, and the packages its data path imports), runs a driver inside it against a
real selector service, and checks what the service ended with against what the driver's fake policy
earned: every group reported once, beliefs equal to the rewards fed, and a resumed run continuing
where its checkpoint left off. A framework that cannot be installed fails here with pip's output.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.frameworks import venvs
from trainer_client.client import SelectorClient

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = ROOT / "tests" / "integrations" / "frameworks"

# A cold venv build (minutes under load) can precede a driver; `make test` builds them beforehand.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def run_driver(venv: str, script: str, args: list[str], timeout: float = 900) -> dict[str, Any]:
    try:
        python, _ = venvs.ensure_locked(venv)
    except venvs.VenvError as exc:
        pytest.fail(f"the {venv} venv could not be built:\n{exc}")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env.pop("SELECTOR_URL", None)
    proc = subprocess.run(
        [str(python), str(DRIVERS / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("DRIVER-REPORT ")]
    assert proc.returncode == 0 and lines, (
        f"{script} in {venv} failed (exit {proc.returncode}):\n{output[-8000:]}"
    )
    return json.loads(lines[-1].removeprefix("DRIVER-REPORT "))


def assert_beliefs_match(url: str, dataset: str, fed: list[list[float]], rollouts_per_prompt: int) -> None:
    """The service's Beta posteriors are exactly prior + the fed successes and failures, and it holds
    one observation per rolled-out group."""
    successes: dict[int, float] = defaultdict(float)
    trials: dict[int, int] = defaultdict(int)
    for prompt_id, reward in fed:
        successes[int(prompt_id)] += reward >= 1.0
        trials[int(prompt_id)] += 1
    with SelectorClient(url) as client:
        info = client.get_dataset(dataset)
        assert info.rollouts == len(fed)
        assert info.observations == len(fed) // rollouts_per_prompt
        beliefs = client.beliefs(dataset, sorted(trials)).beliefs
    assert [b.prompt_id for b in beliefs] == sorted(trials)
    for belief in beliefs:
        pid = belief.prompt_id
        assert (belief.alpha, belief.beta) == pytest.approx(
            (1.0 + successes[pid], 1.0 + trials[pid] - successes[pid])
        ), f"prompt {pid}"


def grpo_advantages(prompt_ids: list[int], scores: list[float]) -> list[float]:
    """GRPO's outcome advantage, (r - mean) / (std + 1e-6) within each prompt's group (unbiased std)."""
    groups: dict[int, list[float]] = defaultdict(list)
    for pid, score in zip(prompt_ids, scores, strict=True):
        groups[pid].append(score)
    out = []
    for pid, score in zip(prompt_ids, scores, strict=True):
        values = groups[pid]
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
        out.append((score - mean) / (std + 1e-6))
    return out


# --------------------------------------------------------------------------------------------------
# verl
# --------------------------------------------------------------------------------------------------

VERL_CASES = [
    pytest.param("verl07", "default", id="verl-0.7.1-default-grpo"),
    pytest.param("verl06", "async", id="verl-0.6.1-async-rollout"),
    pytest.param("verl09", "main", id="verl-0.9.1-entry-point"),
]


@pytest.mark.parametrize(("venv", "mode"), VERL_CASES)
def test_verl_trainer_reports_every_group_and_resumes(
    service: Any, dsname: str, tmp_path: Path, venv: str, mode: str
) -> None:
    report = run_driver(
        venv,
        "drive_verl.py",
        ["--url", service.url, "--dataset", dsname, "--workdir", str(tmp_path), "--mode", mode],
    )
    first, resumed = report["runs"]
    n, batch = 4, 3
    # Run 1: three steps through verl's fit(), each a full selected batch of `batch` groups of `n`.
    assert len(first["updates"]) == 3
    # Run 2 resumed from the checkpoint of step 2 in the middle of the 4-step epoch: it trains the
    # epoch's last two steps (3 and 4) and stops, instead of starting a fresh 4-step epoch.
    assert len(resumed["updates"]) == 2
    assert resumed["run_id"] == first["run_id"]
    # Service steps: run 1 reported 0, 1, 2; the resumed run continues after them.
    assert first["next_step"] == 3 and resumed["next_step"] == 5
    earned: dict[int, list[float]] = defaultdict(list)
    for prompt_id, reward in report["fed"]:
        earned[int(prompt_id)].append(reward)
    trained: dict[int, list[float]] = defaultdict(list)
    for update in first["updates"] + resumed["updates"]:
        ids = update["prompt_ids"]
        counts = {pid: ids.count(pid) for pid in set(ids)}
        assert len(counts) == batch and set(counts.values()) == {n}
        # verl's GRPO advantages were computed from exactly the scores the selector saw.
        assert update["advantages"] == pytest.approx(grpo_advantages(ids, update["scores"]), abs=1e-4)
        for pid, score in zip(ids, update["scores"], strict=True):
            trained[pid].append(score)
    # verl's rule reward (GSM8K scorer) gave each sample the reward the fake policy aimed for.
    assert {p: sorted(v) for p, v in trained.items()} == {p: sorted(v) for p, v in earned.items()}
    assert_beliefs_match(service.url, dsname, report["fed"], n)
    if mode == "main":
        assert report["sampler"] == "SelectorCurriculumSampler"
        assert report["trainer"] == "SelectorRayPPOTrainer"
        guards = report["guards"]
        assert "Could not override 'data.sampler.class_path'" in guards["legacy_overrides"]
        assert "verl 0.5-0.7 route" in guards["class_path_with_entry_point"]
        assert "filter_groups" in guards["filter_groups"]
        assert "removed AbstractCurriculumSampler" in guards["sampler_without_entry_point"]


# --------------------------------------------------------------------------------------------------
# AReaL (asynchronous)
# --------------------------------------------------------------------------------------------------


def test_areal_async_rollout_reports_every_group_late_or_not(
    service: Any, dsname: str, tmp_path: Path
) -> None:
    report = run_driver(
        "areal", "drive_areal.py", ["--url", service.url, "--dataset", dsname, "--workdir", str(tmp_path)]
    )
    n, batch = 4, 3
    first, resumed = report["runs"]
    for run in report["runs"]:
        # Two training steps per run, each a full batch of groups with AReaL's advantages computed.
        assert len(run["batches"]) == 2
        for trained in run["batches"]:
            assert trained["has_advantages"] and [len(r) for r in trained["rewards"]] == [n] * batch
        # Every group finished was reported, none refused as too late, none left half-collected.
        assert run["lost"] == [] and run["pending"] == []
    reported = first["reported"] + resumed["reported"]
    assert len({(step, pid) for step, pid, _ in reported}) == len(reported) == len(report["fed"]) // n
    # The rollout ran ahead of training: some groups arrived after the next step had been selected,
    # and the service took them as late evidence.
    assert max(lag for _, _, lag in reported) >= 1
    # The resumed loader continued after the checkpoint taken once steps 0 and 1 were trained (the
    # dispatcher may have pulled part of step 2 before it; those rows keep their step), never from 0.
    assert min(step for step, _, _ in resumed["reported"]) >= 2
    assert resumed["next_step"] > first["next_step"]
    assert_beliefs_match(service.url, dsname, report["fed"], n)


# --------------------------------------------------------------------------------------------------
# OpenRLHF (through the selector's train_ppo_ray entry point)
# --------------------------------------------------------------------------------------------------


def group_norm_advantages(scores: list[float], n: int) -> list[float]:
    """OpenRLHF's ``group_norm`` advantage: (r - mean) / (std + 1e-9) within each run of ``n`` samples
    (a prompt's group; the same prompt may come twice in one batch, selected at two steps)."""
    out = []
    for start in range(0, len(scores), n):
        values = scores[start : start + n]
        mean = sum(values) / n
        std = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
        out.extend((v - mean) / (std + 1e-9) for v in values)
    return out


@pytest.mark.parametrize("filtering", [False, True], ids=["grpo", "dynamic-filtering"])
def test_openrlhf_trainer_reports_every_group_and_resumes(
    service: Any, dsname: str, tmp_path: Path, filtering: bool
) -> None:
    report = run_driver(
        "openrlhf",
        "drive_openrlhf.py",
        ["--url", service.url, "--dataset", dsname, "--workdir", str(tmp_path)]
        + (["--filtering"] if filtering else []),
    )
    n, batch = 4, 3
    first, resumed = report["runs"]
    assert first["preempted"] and not resumed["preempted"]
    earned: dict[int, list[float]] = defaultdict(list)
    for prompt_id, reward in report["fed"]:
        earned[int(prompt_id)].append(reward)
    trained: dict[int, list[float]] = defaultdict(list)
    for run in report["runs"]:
        for update in run["updates"]:
            ids = [row["prompt_id"] for row in update]
            scores = [row["score"] for row in update]
            # One prompt per group of n consecutive samples.
            assert len(ids) % n == 0 and all(len(set(ids[i : i + n])) == 1 for i in range(0, len(ids), n))
            groups = [scores[i : i + n] for i in range(0, len(ids), n)]
            # OpenRLHF's group_norm advantages, computed from the rewards its reward_func gave.
            assert [row["advantage"] for row in update] == pytest.approx(
                group_norm_advantages(scores, n), abs=1e-4
            )
            if filtering:
                # Dynamic filtering kept only groups with mixed rewards (at most a batch per update).
                assert 1 <= len(groups) <= batch
                assert all(0 < sum(group) < n for group in groups)
            else:
                assert len(set(ids)) == len(groups) == batch
            for pid, score in zip(ids, scores, strict=True):
                trained[pid].append(score)
    # The reward_func scored each sample as the fake policy aimed for: what trained is what was earned
    # (all of it without filtering; a part of it with).
    for pid, scores in trained.items():
        assert not Counter(scores) - Counter(earned[pid]), f"prompt {pid}"
    if not filtering:
        assert {p: sorted(v) for p, v in trained.items()} == {p: sorted(v) for p, v in earned.items()}
    if filtering:
        # Groups dynamic filtering dropped were rolled out and reported too, not only the trained ones.
        trained_samples = sum(len(update) for run in report["runs"] for update in run["updates"])
        assert len(report["fed"]) > trained_samples
        # Preempted in the PPO update of step 2 (its batch was handed over), resumed from the checkpoint
        # of step 1: the resumed run trains on.
        assert len(first["updates"]) == 2 and len(resumed["updates"]) >= 1
        assert resumed["open_step"] > first["open_step"]
    else:
        # Run 1 handed three steps' batches to the actors and was preempted in the PPO update of
        # step 3, after its rollouts were reported (service steps 0, 1, 2). Run 2 resumed from the
        # checkpoint of step 2 in the middle of the 4-step epoch: it trains the epoch's last two steps,
        # selected as service steps 3 and 4 (never step 2 again), and stops.
        assert len(first["updates"]) == 3 and len(resumed["updates"]) == 2
        assert first["open_step"] == 2 and resumed["open_step"] == 4
    assert_beliefs_match(service.url, dsname, report["fed"], n)
