"""The adapters driven by the trainer frameworks' own code, each framework in its own cached venv.

Each test builds (or reuses) the framework's venv (tests/integrations/frameworks/venvs.py: the framework from PyPI
with --no-deps, CPU torch, and the packages its data path imports), installs the client package's wheel
into it with its dependencies as a user would (tests/integrations/frameworks/client_install.py; it must
change no package already there), runs a driver inside it against a real selector service, the client
imported from that install, and checks what the service ended with against what the driver's fake policy
earned: every group reported once, beliefs equal to the rewards fed, and a resumed run continuing
where its checkpoint left off. A framework that cannot be installed fails here with pip's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from rlvr_selector_client.client import SelectorClient
from tests.integrations.frameworks import client_install, venvs

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = ROOT / "tests" / "integrations" / "frameworks"

# A cold venv build (minutes under load) can precede a driver; `make test` builds them beforehand.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def run_driver(venv: str, script: str, args: list[str], timeout: float = 900) -> dict[str, Any]:
    try:
        python, _ = venvs.ensure_locked(venv)
    except venvs.VenvError as exc:
        pytest.fail(f"the {venv} venv could not be built:\n{exc}")
    installed = client_install.ensure_installed(python)
    assert not installed["changed"], (
        f"installing the client in {venv} moved its packages: {installed['changed']}"
    )
    # The repository root is on the path for the drivers' helpers (tests/); the client package is not
    # (it lives under client/): the driver imports the venv's install.
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
    report = json.loads(lines[-1].removeprefix("DRIVER-REPORT "))
    imported = Path(report["client_module"] or "")
    assert imported.is_relative_to(python.parent.parent), f"{script} imported the client from {imported}"
    return report


def assert_beliefs_match(url: str, dataset: str, fed: list[list[float]], *, groups: int) -> None:
    """The service's Beta posteriors are exactly prior + the fed (prompt id, reward) pairs' successes and
    failures, and it holds one observation per rolled-out group (`groups` of them)."""
    successes: dict[int, float] = defaultdict(float)
    trials: dict[int, int] = defaultdict(int)
    for prompt_id, reward in fed:
        successes[int(prompt_id)] += reward >= 1.0
        trials[int(prompt_id)] += 1
    with SelectorClient(url) as client:
        info = client.get_dataset(dataset)
        assert info.rollouts == len(fed)
        assert info.observations == groups
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
    pytest.param("verl09", "main", id="verl-0.9.1-legacy-trainer"),
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
    assert_beliefs_match(service.url, dsname, report["fed"], groups=len(report["fed"]) // n)
    # A group size other than the dataset's rollouts_per_prompt is refused, saying what to set.
    guard = report["group_size_guard"]
    if mode == "main":
        assert (
            f"rollouts_per_prompt={2 * n} in the selector options but actor_rollout_ref.rollout.n is {n}"
            in guard
        )
    else:
        assert f"groups of {n} completions but the selector's dataset has rollouts_per_prompt=8" in guard
        assert "actor_rollout_ref.rollout.n=8" in guard
    if mode == "main":
        assert report["sampler"] == "SelectorCurriculumSampler"
        assert report["trainer"] == "SelectorRayPPOTrainer"
        guards = report["guards"]
        assert "Could not override 'data.sampler.class_path'" in guards["legacy_overrides"]
        assert "verl 0.5-0.7 route" in guards["class_path_with_entry_point"]
        assert "filter_groups" in guards["filter_groups"]
        assert "removed AbstractCurriculumSampler" in guards["sampler_without_entry_point"]


# --------------------------------------------------------------------------------------------------
# TRL
# --------------------------------------------------------------------------------------------------


def test_trl_example_reports_each_generation_at_its_step_and_refuses_the_mistakes(
    service: Any, dsname: str, tmp_path: Path
) -> None:
    """examples/trl_grpo.py, the TRL example of docs/integrations.md, run by TRL 1.16's GRPOTrainer in a
    venv of TRL and its dependencies with the client's wheel installed (drive_trl.py): each generation's
    prompts are the step selected for it, its `accuracy` rewards (not the format bonus) are reported at
    that step, on time, although TRL's loader fetches ahead; no step is selected that is not trained;
    a second run (the service from SELECTOR_URL / SELECTOR_DATASET) continues after the first; and the
    mistakes the docs warn about are refused when the trainer is built, saying what to do."""
    report = run_driver(
        "trl", "drive_trl.py", ["--url", service.url, "--dataset", dsname, "--workdir", str(tmp_path)]
    )
    assert report["trl"] == "1.16.0"
    group, per_step = report["group_size"], report["prompts_per_step"]
    first, again = report["runs"]
    assert first == {"global_step": 3, "selects": 3, "reports": 3}
    assert again == {"global_step": 2, "selects": 5, "reports": 5}
    selected, observed = report["selected"], report["observed"]
    # One select per generation, steps 0..4 in order (the second run continued at 3), each reported once
    # at its own step, with the accuracy rewards of exactly the prompts selected there.
    assert [s["step"] for s in selected] == [o["step"] for o in observed] == list(range(5))
    # (tests/integrations/test_integrations.py tells the named reward from another that always differs.)
    accuracy, bonus = report["rewards"]["accuracy"], report["rewards"]["format_reward"]
    assert len(accuracy) == len(bonus) == 5
    for sent, chosen, rewarded in zip(observed, selected, accuracy, strict=True):
        assert sent["selected_step"] == sent["step"] and sent["lag"] == 0
        assert sorted(pid for pid, _ in sent["results"]) == sorted(chosen["prompt_ids"])
        assert len(sent["results"]) == per_step and all(len(r) == group for _, r in sent["results"])
        reported = sorted((pid, reward) for pid, rewards in sent["results"] for reward in rewards)
        assert reported == sorted((int(pid), reward) for pid, reward in rewarded)
    # The service's history: every closed step observed its whole batch at that step, none late.
    rows = report["history"]["rows"]
    assert [row["step"] for row in rows] == list(range(4)) and report["history"]["open_step"] == 4
    assert all(row["observed"] == per_step and not row["late"] for row in rows)
    fed = [pair for call in accuracy for pair in call]
    assert_beliefs_match(service.url, dsname, fed, groups=len(fed) // group)
    mistakes = report["mistakes"]
    assert "2 reward functions ['format_reward', 'accuracy']" in mistakes["no_observe_reward"]
    assert "observe_reward=" in mistakes["no_observe_reward"]
    assert "rollouts_per_prompt=2, but num_generations is 4" in mistakes["num_generations"]
    assert "Set num_generations to 2" in mistakes["num_generations"]
    assert "/api is not the selector service's URL" in mistakes["url_with_a_path"]
    assert "Check the URL" in mistakes["url_with_a_path"]


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
    assert_beliefs_match(service.url, dsname, report["fed"], groups=len(report["fed"]) // n)
    check_areal_late_case(service.url, report["late"], n, batch)


def check_areal_late_case(url: str, late: dict[str, Any], n: int, batch: int) -> None:
    """The driver's late case: every sample of some groups answers only once the rollout's weights are
    3-4 versions newer than when the group started (waiting on versions, not on time), on a dataset whose
    max_lag is 1; the first process dies with a held group generating, after saving the loader's state at
    step 3 of 6, and a new process resumes from that state. Groups reported far past max_lag, in either
    process, are filed at the open step: nothing refused, every finished group reported once, the
    service's beliefs exactly what was fed. The group generating when the first process died fed nothing
    and is never reported: AReaL's checkpoint keeps no rollout, and the resumed loader starts after it."""
    first, resumed = late["runs"]
    max_lag = late["max_lag"]
    assert resumed["pid"] != first["pid"], "the run was not resumed in a new process"
    assert len(first["batches"]) == 6 and len(resumed["batches"]) == 4
    for run in late["runs"]:
        for trained in run["batches"]:
            assert trained["has_advantages"] and [len(r) for r in trained["rewards"]] == [n] * batch
        assert run["quiet"], f"the {run['role']} process did not settle: {run}"
        assert run["lost"] == [] and run["pending"] == []
    # The held groups really spanned 3 and 4 weights versions (the first process) and 3 (the resumed
    # one); a third was still held when the first process died.
    spans = [
        [(w["span"], w["to_version"] - w["from_version"] >= w["span"]) for w in run["waits"]]
        for run in late["runs"]
    ]
    assert sorted(spans[0]) == [(3, True), (4, True)] and spans[1] == [(3, True)]
    assert first["died_holding"] == 1
    # Both processes reported groups later than max_lag, and the service took them.
    for run in late["runs"]:
        assert [lag for _, _, lag in run["reported"] if lag > max_lag], run["reported"]
    # The resumed process continued after every step the first one selected (none re-issued).
    assert (
        min(step for step, _, _ in resumed["reported"]) >= first["next_step"] > first["checkpoint_next_step"]
    )
    reported = first["reported"] + resumed["reported"]
    assert len({(step, pid) for step, pid, _ in reported}) == len(reported) == len(late["fed"]) // n
    assert_beliefs_match(url, late["dataset"], late["fed"], groups=len(late["fed"]) // n)


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
    assert_beliefs_match(service.url, dsname, report["fed"], groups=len(report["fed"]) // n)


# --------------------------------------------------------------------------------------------------
# verl 0.9's v1 trainer (trainer.use_v1=True): sync, colocate-async, separate-async
# --------------------------------------------------------------------------------------------------

V1_CASES = [
    "sync",
    "sync_filter_groups",
    "colocate_async",
    "separate_async",
    "sync_budget",
    "colocate_async_budget",
    "colocate_async_late",
]


@pytest.fixture(scope="module")
def verl_v1_report(service: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One driver run for every v1 case (it starts Ray and TransferQueue once: most of its cost)."""
    work = tmp_path_factory.mktemp("verl-v1")
    prefix = f"v1-{uuid.uuid4().hex[:8]}"
    return run_driver(
        "verl09",
        "drive_verl_v1.py",
        [
            "--url",
            service.url,
            "--dataset-prefix",
            prefix,
            "--workdir",
            str(work),
            "--cases",
            ",".join(V1_CASES),
        ],
        timeout=1800,
    )


def applied_beliefs_match(url: str, dataset: str, reports: list[dict[str, Any]]) -> None:
    """The service holds exactly the applied reports: Beta posteriors = prior + their rewards, one
    observation each."""
    applied = [r for r in reports if "refused" not in r and not r["duplicate"]]
    assert len({(r["step"], r["prompt_id"]) for r in applied}) == len(applied), "a group was applied twice"
    fed = [[r["prompt_id"], reward] for r in applied for reward in r["rewards"]]
    assert_beliefs_match(url, dataset, fed, groups=len(applied))


def check_v1_run(
    run: dict[str, Any],
    n: int,
    filtering: bool,
    sizes: dict[tuple[int, int], int] | None = None,
    late: bool = False,
) -> dict[str, list[float]]:
    """One trainer run: every trained group was reported with the rewards verl trained on, GRPO
    advantages come from exactly those rewards per group, and every group the policy rolled out in this
    run was reported (restored ones aside; in a run killed mid-step, the responses of groups still in
    flight are accounted for as such). Reports are within the dataset's ``max_lag`` unless ``late``
    (reports past it are filed at the open step, docs/api.md section 4). Returns the reported rewards by
    group uid."""
    by_uid: dict[str, list[float]] = {}
    for report in run["reports"]:
        assert report["uid"] not in by_uid, f"group {report['uid']} reported twice in one run"
        by_uid[report["uid"]] = report["rewards"]
    trained_uids = set()
    for update in run["updates"]:
        rows = [row for row in update["rows"] if not row["padding"]]
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            groups[row["uid"]].append(row)
        for uid, group in groups.items():
            scores = [row["score"] for row in group]
            step, prompt_id = group[0]["step"], group[0]["prompt_id"]
            size = n if sizes is None else sizes[(step, prompt_id)]
            assert len(scores) == size, f"group {uid} trained with {len(scores)} rollouts, not {size}"
            # verl's GRPO over TransferQueue, per prompt uid, from the rewards the selector saw.
            expected = grpo_advantages([0] * len(scores), scores)
            assert [row["advantage"] for row in group] == pytest.approx(expected, abs=1e-4)
            assert uid in by_uid, f"group {uid} was trained on but never reported"
            assert sorted(scores) == sorted(by_uid[uid]), (
                f"group {uid}: trained on other rewards than reported"
            )
            if filtering:
                assert 0 < sum(scores) < len(scores), "filter_groups let a group without spread through"
            trained_uids.add(uid)
    assert trained_uids <= set(by_uid)
    if sizes is not None:
        # Each report carries the group's real size: the count the service gave that prompt.
        for report in run["reports"]:
            assert len(report["rewards"]) == sizes[(report["step"], report["prompt_id"])], report
    # Every group verl evicted (stale under `drop`, filtered by DAPO) had been reported first.
    for reason in ("stale", "filtered"):
        assert set(run["evicted"][reason]) <= set(by_uid), f"{reason} groups were evicted unreported"
    # Every sample the fake policy generated in this run reached a report (groups a resumed run's
    # TransferQueue restored as finished were generated by the earlier run).
    restored = set(run["restored_finished"])
    earned: dict[int, list[float]] = defaultdict(list)
    for prompt_id, reward in run["fed"]:
        earned[int(prompt_id)].append(reward)
    reported: dict[int, list[float]] = defaultdict(list)
    for report in run["reports"]:
        if report["uid"] not in restored:
            reported[report["prompt_id"]].extend(report["rewards"])
    for group in run.get("in_flight_at_crash", []):
        reported[group["prompt_id"]].extend(group["rewards"])
    assert {p: sorted(v) for p, v in reported.items()} == {p: sorted(v) for p, v in earned.items()}
    assert run["lost"] == [], "groups were refused as too late"
    assert all(r.get("lag", 0) >= 0 for r in run["reports"])
    if not late:
        assert all(r.get("lag", 0) <= run["max_lag"] for r in run["reports"])
    return by_uid


@pytest.mark.parametrize("case", ["sync", "colocate_async", "separate_async"])
def test_verl_v1_mode_reports_every_group_and_resumes(
    service: Any, verl_v1_report: dict[str, Any], case: str
) -> None:
    n, batch = 4, 3
    result = verl_v1_report["cases"][case]
    first, resumed = result["runs"]
    verl_class = {"sync": "PPOTrainerSync", "colocate_async": "PPOTrainerColocateAsync"}.get(
        case, "PPOTrainerSeparateAsync"
    )
    assert first["trainer"] == f"Selector{verl_class}" and first["sampler"] == "SelectorCurriculumSampler"
    assert first["buffer"] == ("SelectorReplayBuffer" if case == "sync" else "SelectorReplayBufferAsync")
    # Three trainer steps, each training `batch` groups (separate-async: three local updates of one).
    trained = [row["uid"] for u in first["updates"] for row in u["rows"] if not row["padding"]]
    assert len(set(trained)) == 3 * batch and first["global_steps"] == 4
    filtering = case == "separate_async"
    seen = check_v1_run(first, n, filtering)
    assert all("refused" not in r and not r["duplicate"] for r in first["reports"])
    if case == "sync":
        # Sync: each step is selected, rolled out and reported before the next is selected.
        assert [r["step"] for r in first["reports"]] == [0] * batch + [1] * batch + [2] * batch
        assert all(r["lag"] == 0 for r in first["reports"]) and first["max_lag"] == 0
    else:
        # Asynchronous: the warm-up batch runs ahead, so groups arrive after the next step was selected
        # and the service takes them as late evidence.
        assert max(r["lag"] for r in first["reports"]) >= 1
        assert first["max_lag"] >= 2
    if case == "separate_async":
        # max_off_policy_threshold=1 and filter_groups: verl dropped stale groups and filtered groups
        # without spread; both had been reported (checked in check_v1_run).
        assert first["evicted"]["stale"] and first["evicted"]["filtered"]
    # The resumed run (from the checkpoint of step 2) trains steps 3 and 4 and selects after the last
    # service step the first run used; a group it reports again is a duplicate or keeps its first
    # report, never counted twice.
    resumed_trained = {row["uid"] for u in resumed["updates"] for row in u["rows"] if not row["padding"]}
    assert len(resumed_trained) == 2 * batch and resumed["global_steps"] == 5
    assert resumed["run_id"] == first["run_id"] and resumed["next_step"] > first["next_step"]
    check_v1_run(resumed, n, filtering)
    for report in resumed["reports"]:
        if report["uid"] not in seen:
            assert report["step"] >= first["next_step"], "the resumed run selected an old step again"
        else:
            assert report.get("duplicate") or report["refused"], report
    if case == "sync":
        assert all(r["uid"] not in seen for r in resumed["reports"])
    else:
        # TransferQueue's checkpoint brought back groups the first run had finished and reported.
        assert resumed["restored_finished"] and set(resumed["restored_finished"]) <= set(seen)
    applied_beliefs_match(service.url, result["dataset"], first["reports"] + resumed["reports"])


def test_verl_v1_filter_groups_reports_the_groups_it_drops(
    service: Any, verl_v1_report: dict[str, Any]
) -> None:
    n = 4
    result = verl_v1_report["cases"]["sync_filter_groups"]
    (run,) = result["runs"]
    # verl forces one prompt per fetch with filter_groups; a service step is still a training batch.
    assert run["gen_batch_size"] == 1
    check_v1_run(run, n, filtering=True)
    # DAPO dropped groups whose rewards were all equal, after they were reported; the refills were the
    # next steps' selections.
    assert run["evicted"]["filtered"]
    dropped = {r["uid"] for r in run["reports"]} - {
        row["uid"] for u in run["updates"] for row in u["rows"] if not row["padding"]
    }
    assert dropped
    assert max(r["step"] for r in run["reports"]) >= 3
    applied_beliefs_match(service.url, result["dataset"], run["reports"])


def test_verl_v1_entry_point_refuses_what_it_cannot_honour(verl_v1_report: dict[str, Any]) -> None:
    guards = verl_v1_report["guards"]
    assert "custom_sampler" in guards["custom_sampler"]
    assert "adv_estimator=gae" in guards["budget_with_gae"]
    assert "rollout_min >= 2" in guards["budget_min_1"]
    assert "runs only in verl's v1 trainer" in guards["legacy_filter_groups"]
    assert guards["legacy_kept"] == "False"


@pytest.mark.parametrize("case", ["sync_budget", "colocate_async_budget"])
def test_verl_v1_rolls_out_each_prompt_by_its_own_count(
    service: Any, verl_v1_report: dict[str, Any], case: str
) -> None:
    """With a rollout budget the service gives each prompt its count; verl's agent loop rolls out that
    many (``__rollout_n__``), GRPO groups them by prompt with their own sizes, verl pads the odd total
    with no-op samples that belong to no group, and each report carries the group's real size."""
    budget, low, high = 13, 2, 8
    (run,) = verl_v1_report["cases"][case]["runs"]
    sizes: dict[tuple[int, int], int] = {}
    for selection in run["selections"]:
        counts = selection["rollouts"]
        assert counts is not None and sum(counts) == budget and all(low <= c <= high for c in counts)
        sizes.update(
            {(selection["step"], pid): c for pid, c in zip(selection["prompt_ids"], counts, strict=True)}
        )
    assert len(set(sizes.values())) > 1, "the budget gave every prompt the same count: nothing is tested"
    check_v1_run(run, 4, filtering=False, sizes=sizes)
    # verl trained on groups of several sizes and padded the batch (13 rollouts per step is not a
    # multiple of the 12 of a mini-batch).
    trained = {}
    for update in run["updates"]:
        for row in update["rows"]:
            if not row["padding"]:
                trained[row["uid"]] = sizes[(row["step"], row["prompt_id"])]
    assert len(set(trained.values())) > 1
    assert any(row["padding"] for update in run["updates"] for row in update["rows"])
    applied_beliefs_match(service.url, verl_v1_report["cases"][case]["dataset"], run["reports"])


def test_verl_v1_long_responses_and_a_resume_in_a_new_process_lose_no_group(
    service: Any, verl_v1_report: dict[str, Any]
) -> None:
    """colocate-async with DAPO's filter, ``drop`` at ``max_off_policy_threshold=1`` and a rollout budget
    (36 over 4 prompts, 2-12 each): one response of some groups takes as long as 3-4 updates, and the
    trainer is killed in the update of step 5 while groups are generating; a new process resumes from the
    checkpoint of step 4. Groups reported long after the dataset's ``max_lag``, in the running process
    and in the resumed one (which re-issues the groups that were in flight at the checkpoint under their
    original step), are filed at the open step: nothing is lost, every group verl rolled out is applied
    once, and the service's beliefs are exactly what was applied."""
    result = verl_v1_report["cases"]["colocate_async_late"]
    first, resumed = result["runs"]
    n, budget, low, high = 3, 36, 2, 12
    assert first["trainer"] == "SelectorPPOTrainerColocateAsync"
    assert first["buffer"] == "SelectorReplayBufferAsync"
    assert first["crashed_in_step"] == 5 and resumed["resumed_from"] == 4
    assert resumed["pid"] != first["pid"], "the run was not resumed in a new process"
    assert resumed["run_id"] == first["run_id"]
    # The killed run trained steps 1-4; the resumed one steps 5 and 6.
    assert len(first["updates"]) == 4 and len(resumed["updates"]) == 2 and resumed["global_steps"] == 7
    max_lag = first["max_lag"]
    sizes: dict[tuple[int, int], int] = {}
    for run in result["runs"]:
        for selection in run["selections"]:
            counts = selection["rollouts"]
            assert counts is not None and sum(counts) == budget and all(low <= c <= high for c in counts)
            sizes.update(
                {(selection["step"], p): c for p, c in zip(selection["prompt_ids"], counts, strict=True)}
            )
    # The long responses really spanned 3 and 4 updates (the fake generation waits for the weights
    # versions, not for a time): the third was still generating when the process was killed.
    assert sorted(
        (w["span"], w["to_version"] - w["from_version"] >= w["span"]) for w in first["long_responses"]
    ) == [
        (3, True),
        (4, True),
    ]
    seen = check_v1_run(first, n, filtering=True, sizes=sizes, late=True)
    check_v1_run(resumed, n, filtering=True, sizes=sizes, late=True)
    assert first["evicted"]["stale"] and first["evicted"]["filtered"]
    # Within the killed run: groups whose long response spanned several updates came back later than
    # max_lag, and were filed at the open step instead of refused.
    assert [r for r in first["reports"] if "refused" not in r and r["lag"] > max_lag]
    # The resumed process re-issued the groups that were in flight at the checkpoint (verl's
    # _reissue_inflight_prompts), under their original service step; those the killed process never
    # finished are reported by it for the first time, long after max_lag, and applied.
    resumed_by_uid = {r["uid"]: r for r in resumed["reports"]}
    fresh = [g for g in resumed["reissued"] if g["uid"] not in seen]
    assert fresh, "no group was in flight at the checkpoint and unfinished by the killed run"
    for group in fresh:
        report = resumed_by_uid[group["uid"]]
        assert "refused" not in report and not report["duplicate"], report
        assert report["step"] == group["step"] < first["next_step"] and report["lag"] > max_lag, report
    # Groups in flight when the process was killed were either in the checkpoint (re-issued and reported
    # by the resumed process) or pulled after it, in step 5, whose rollouts died with the process.
    reissued = {g["uid"] for g in resumed["reissued"]}
    for group in first["in_flight_at_crash"]:
        if group["uid"] in reissued:
            assert group["uid"] in resumed_by_uid
        else:
            assert group["global_steps"] == 5, group
    # Once each: every report (a duplicate of a restored group, a superseded re-roll) names a group
    # applied exactly once, in one of the two processes.
    reports = first["reports"] + resumed["reports"]
    applied = [(r["step"], r["prompt_id"]) for r in reports if "refused" not in r and not r["duplicate"]]
    assert len(applied) == len(set(applied))
    assert {(r["step"], r["prompt_id"]) for r in reports} == set(applied)
    applied_beliefs_match(service.url, result["dataset"], reports)


# --------------------------------------------------------------------------------------------------
# Tinker cookbook (tinker_cookbook.rl.train, the Tinker service faked behind the SDK's clients)
# --------------------------------------------------------------------------------------------------


def service_history(url: str, dataset: str) -> tuple[dict[int, dict[str, Any]], int]:
    """The service's closed steps (GET /datasets/{name}/history), by step, and its open step."""
    with SelectorClient(url) as client:
        body = client._http.get(f"/datasets/{dataset}/history").json()
    return {int(row["step"]): row for row in body["rows"]}, int(body["open_step"])


def check_steps_on_time(url: str, dataset: str, steps: int, per_step: int) -> None:
    """Steps ``0..steps-1`` each observed at their own step, on time: the closed ones hold their whole
    batch (``per_step`` groups) and nothing late, and the last selected step is the open one (a run
    that selected a step it never rolled out would leave a row observing nothing, or open a step more)."""
    rows, open_step = service_history(url, dataset)
    assert open_step == steps - 1, f"the service is at step {open_step}, not {steps - 1}"
    assert sorted(rows) == list(range(steps - 1))
    for step, row in rows.items():
        assert row["observed"] == per_step and not row["late"], (step, row)


def reported_pairs(reports: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """Every (prompt id, reward) the recorded ``/observe`` calls sent, sorted."""
    return sorted((int(pid), reward) for r in reports for pid, rewards in r["results"] for reward in rewards)


def check_tinker_updates(
    run: dict[str, Any], updates: list[list[dict[str, Any]]], sizes: dict[int, int]
) -> None:
    """Each optimiser update trained one selected step: its prompts, each with its group's size, and the
    cookbook's centred advantages (reward - group mean) of the rewards the selector was sent."""
    selections = run["selections"]
    assert len(updates) == len(selections)
    for update, (step, _, prompt_ids, counts) in zip(updates, selections, strict=True):
        by_prompt: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for datum in update:
            by_prompt[datum["prompt_id"]].append(datum)
        assert sorted(by_prompt) == sorted(prompt_ids), f"step {step} trained other prompts than selected"
        for i, pid in enumerate(prompt_ids):
            group = by_prompt[pid]
            assert len(group) == (counts[i] if counts else sizes[pid])
            mean = sum(d["reward"] for d in group) / len(group)
            assert [d["advantage"] for d in group] == pytest.approx(
                [d["reward"] - mean for d in group], abs=1e-6
            )


def test_tinker_cookbook_example_trains_on_selected_prompts_and_refuses_the_mistakes(
    service: Any, dsname: str, tmp_path: Path
) -> None:
    """examples/tinker_grpo.py, the Tinker example of docs/integrations.md, run by tinker-cookbook 0.6's
    ``rl.train.main`` with the Tinker service faked behind the SDK's clients (drive_tinker.py).
    Synchronous: the prompts of each step are the ones the service picked, every group is reported once
    at its own step, on time, with its ProblemEnv ``correct`` metric (``reward_key``), and a run that dies
    after step 2's groups were reported resumes from the cookbook's checkpoint at the next service step,
    the service named by the ``SELECTOR_*`` variables. Without ``reward_key`` (and with a rollout budget):
    the total reward, format penalty included, and every group with the size the service gave it.
    Asynchronous: groups finishing after later steps were selected are reported for the step they were
    selected at (late within max_lag; a group held past max_lag is filed at the open step), none refused.
    A group size other than the dataset's, a URL with a path and a ``reward_key`` the environment does not
    log each stop the run, saying what to do."""
    report = run_driver(
        "tinker", "drive_tinker.py", ["--url", service.url, "--dataset", dsname, "--workdir", str(tmp_path)]
    )
    n, batch = report["group_size"], 3
    observed = report["observed"]
    # Synchronous, with a death and a resume.
    first, resumed = report["sync"]["runs"]
    assert first["died"] and not resumed["died"]
    # The first run selected steps 0-2 for the cookbook's batches 0-2 and trained two of them; it died in
    # the update of batch 2, after that step's groups were reported.
    assert [(s[0], s[1]) for s in first["selections"]] == [(0, 0), (1, 1), (2, 2)]
    first_updates = resumed["updates"][: len(first["updates"])]
    assert first_updates == first["updates"] and len(first["updates"]) == 2
    check_tinker_updates({"selections": first["selections"][:2]}, first["updates"], defaultdict(lambda: n))
    # The resumed run restarted at the cookbook's checkpoint (batch 2) and selected after step 2: the
    # service never went back to a step, and nothing was resent.
    assert [(s[0], s[1]) for s in resumed["selections"]] == [(3, 2), (4, 3)]
    check_tinker_updates(resumed, resumed["updates"][2:], defaultdict(lambda: n))
    # The resumed run had no selector settings on its command line: SELECTOR_URL, _DATASET, _SEED and
    # _STRATEGY named them (the first run's came from its command line and the defaults).
    assert first["options"] == {"strategy": "uniform", "seed": 3}  # the adapters' default
    assert resumed["options"] == {"strategy": "mopps", "seed": 7}
    reported = first["reported"] + resumed["reported"]
    assert len({(step, pid) for step, pid, *_ in reported}) == len(reported) == 5 * batch
    assert all(size == n and lag == 0 and not dup for _, _, size, lag, dup in reported)
    assert first["lost"] == resumed["lost"] == []
    # Each group at the step it was selected at, with the `correct` metric of each answer: exactly what
    # the fake policy earned (the cookbook's total would be 0.9 / -0.1, the answers missing the format).
    sync = observed[dsname]
    assert all(r["selected_step"] == r["step"] and r["lag"] == 0 for r in sync)
    selected_at = {(s[0], pid) for run in (first, resumed) for s in run["selections"] for pid in s[2]}
    assert {(r["step"], pid) for r in sync for pid, _ in r["results"]} == selected_at
    earned = report["sync"]["earned"]
    assert reported_pairs(sync) == sorted((int(pid), reward) for pid, reward in earned)
    assert_beliefs_match(service.url, dsname, earned, groups=len(reported))
    check_steps_on_time(service.url, dsname, steps=5, per_step=batch)

    # A rollout budget, no reward_key: 10 rollouts per step, 2 to 6 per prompt; each group as large as its
    # count; the reward reported is the cookbook's total, ProblemEnv's `correct - 0.1 * (1 - format)`.
    (budget,) = report["budget"]["runs"]
    counts = [s[3] for s in budget["selections"]]
    assert all(sum(c) == 10 and all(2 <= x <= 6 for x in c) for c in counts)
    assert any(len(set(c)) > 1 for c in counts), "the budget gave every prompt the same count"
    check_tinker_updates(budget, budget["updates"], {})
    sizes = {(s[0], pid): c for s in budget["selections"] for pid, c in zip(s[2], s[3], strict=True)}
    assert sorted((step, pid, size) for step, pid, size, *_ in budget["reported"]) == sorted(
        (step, pid, size) for (step, pid), size in sizes.items()
    )
    got = reported_pairs(observed[f"{dsname}-budget"])
    want = sorted((int(pid), reward - 0.1) for pid, reward in report["budget"]["earned"])
    assert [pid for pid, _ in got] == [pid for pid, _ in want]
    assert [reward for _, reward in got] == pytest.approx([reward for _, reward in want])
    check_steps_on_time(service.url, f"{dsname}-budget", steps=2, per_step=batch)

    # Asynchronous, one step off policy.
    late = report["async"]
    (run,) = late["runs"]
    max_lag = late["max_lag"]
    assert run["lost"] == [] and len(run["updates"]) == 4
    selected = {(s[0], pid) for s in run["selections"] for pid in s[2]}
    reported = {(step, pid): lag for step, pid, size, lag, dup in run["reported"]}
    assert len(reported) == len(run["reported"]) and set(reported) <= selected
    assert all(size == n and not dup for _, _, size, _, dup in run["reported"])
    # Every selected step was rolled out and reported (the cookbook's loader stops at the last batch).
    assert set(reported) == selected
    assert all(r["selected_step"] == r["step"] for r in observed[f"{dsname}-async"])
    # Groups finished after the next step had been selected, and the service took them late...
    assert any(1 <= lag <= max_lag for lag in reported.values())
    # ...and the group held for three updates came back later than max_lag: filed at the open step.
    (held,) = late["held"]
    assert reported[tuple(held)] > max_lag
    # Every group trained had been selected and reported; every graded group was applied once.
    trained = {datum["prompt_id"] for update in run["updates"] for datum in update}
    assert trained <= {pid for _, pid in reported}
    assert_beliefs_match(service.url, f"{dsname}-async", late["earned"], groups=len(reported))
    history, _ = service_history(service.url, f"{dsname}-async")
    assert sum(sum(row["late"].values()) for row in history.values()) >= 1

    # A later batch's group started first: its step was selected after the earlier one's.
    order = report["order"]
    assert [(s[0], s[1]) for s in order["selections"]] == [(0, 0), (1, 1)]
    assert order["later_step"] == 1 and order["later_prompt"] in order["selections"][1][2]
    assert not order["earlier_started"] and order["envs"] == n

    mistakes = report["mistakes"]
    assert f"created with rollouts_per_prompt={n}, but group_size is {n + 2}" in mistakes["group_size"]
    assert f"Set group_size to {n}" in mistakes["group_size"]
    assert "/api is not the selector service's URL" in mistakes["url_with_a_path"]
    assert "Check the URL" in mistakes["url_with_a_path"]
    # With rollout_error_tolerance the cookbook skips the failing groups; the next batch stops the run.
    assert "reward_key='accuracy'" in mistakes["reward_key"]
    assert "its metrics: ['correct', 'format']" in mistakes["reward_key"]


# --------------------------------------------------------------------------------------------------
# SkyRL (skyrl.train.trainer.RayPPOTrainer, generation and the FSDP workers faked)
# --------------------------------------------------------------------------------------------------


def check_skyrl_update(update: list[dict[str, Any]], prompts: list[int], n: int) -> None:
    """One policy update trained exactly these prompts' groups of n, with GRPO's sign: above the
    group's mean reward a positive advantage, below a negative one, none without spread."""
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in update:
        groups[row["prompt_id"]].append(row)
    assert sorted(groups) == sorted(prompts)
    for pid, rows in groups.items():
        assert len(rows) == n, f"prompt {pid}"
        mean = sum(r["reward"] for r in rows) / n
        for r in rows:
            expected = (r["reward"] > mean) - (r["reward"] < mean)
            assert (r["advantage"] > 1e-9) - (r["advantage"] < -1e-9) == expected, (pid, rows)


def test_skyrl_trainer_trains_on_selected_prompts_and_refuses_the_mistakes(
    service: Any, dsname: str, tmp_path: Path
) -> None:
    """skyrl 0.3's ``RayPPOTrainer.train`` as `SelectorRayPPOTrainer`, with the data, overrides and options
    of examples/skyrl_grpo.py (drive_skyrl.py): each step trains the prompts the service picked, every
    group rolled out (those dynamic sampling filters out included) is reported once at its own step, on
    time, no step is selected that is not rolled out, and a trainer that dies in its third update resumes
    from SkyRL's checkpoint at the next service step, its options from the ``SELECTOR_*`` variables. A
    ``generator.n_samples_per_prompt`` other than the dataset's, a URL with a path and a ``reward_key``
    are refused when the trainer is built, saying what to do."""
    report = run_driver(
        "skyrl", "drive_skyrl.py", ["--url", service.url, "--dataset", dsname, "--workdir", str(tmp_path)]
    )
    n, batch = 4, 3
    first, resumed = report["grpo"]["runs"]
    assert first["died"] and not resumed["died"]
    # Steps 0-2 selected and reported; two updates trained before the third died.
    assert [r[0] for r in first["reported"]] == [0, 1, 2] and len(first["updates"]) == 2
    for update, (_, prompts, _, _) in zip(first["updates"], first["reported"], strict=False):
        check_skyrl_update(update, prompts, n)
    # Resumed from the checkpoint of step 2 (its dataloader state): the epoch's last two batches, at
    # service steps 3 and 4, never step 2 again; the same run id.
    assert resumed["run_id"] == first["run_id"] and resumed["start_step"] == 3
    # The resumed trainer's options came from SELECTOR_URL, _DATASET, _SEED and _STRATEGY.
    assert first["options"] == {"strategy": "uniform", "seed": 4}  # the adapters' default
    assert resumed["options"] == {"strategy": "mopps", "seed": 7}
    assert [r[0] for r in resumed["reported"]] == [3, 4]
    assert resumed["updates"][:2] == first["updates"] and len(resumed["updates"]) == 4
    for update, (_, prompts, _, _) in zip(resumed["updates"][2:], resumed["reported"], strict=True):
        check_skyrl_update(update, prompts, n)
    reports = first["reported"] + resumed["reported"]
    assert all(size == n * batch and not dup and len(ids) == batch for _, ids, size, dup in reports)
    assert first["lost"] == resumed["lost"] == []
    fed = first["earned"] + resumed["earned"]
    assert_beliefs_match(service.url, dsname, fed, groups=len(fed) // n)
    check_steps_on_time(service.url, dsname, steps=5, per_step=batch)

    # Dynamic sampling (filter): the trainer drew batches (service steps) until it had a batch of groups
    # with reward spread; every group drawn was reported, the trained ones were the spread ones.
    (filtered,) = report["filter"]["runs"]
    assert len(filtered["reported"]) > len(filtered["updates"]) >= 1
    assert [r[0] for r in filtered["reported"]] == list(range(len(filtered["reported"])))
    reported_prompts = [pid for _, ids, _, _ in filtered["reported"] for pid in ids]
    for update in filtered["updates"]:
        trained = sorted({row["prompt_id"] for row in update})
        assert set(trained) <= set(reported_prompts) and len(trained) == batch
        check_skyrl_update(update, trained, n)
        assert all(0 < sum(r["reward"] for r in update if r["prompt_id"] == pid) < n for pid in trained)
    assert_beliefs_match(
        service.url, f"{dsname}-filter", filtered["earned"], groups=len(filtered["earned"]) // n
    )
    check_steps_on_time(service.url, f"{dsname}-filter", steps=len(filtered["reported"]), per_step=batch)

    mistakes = report["mistakes"]
    assert (
        f"created with rollouts_per_prompt={n}, but generator.n_samples_per_prompt is {n + 2}"
        in mistakes["n_samples_per_prompt"]
    )
    assert f"Set generator.n_samples_per_prompt to {n}" in mistakes["n_samples_per_prompt"]
    assert "/api is not the selector service's URL" in mistakes["url_with_a_path"]
    assert "Check the URL" in mistakes["url_with_a_path"]
    assert (
        "reward_key='correct'" in mistakes["reward_key"]
        and "leave reward_key unset" in mistakes["reward_key"]
    )
