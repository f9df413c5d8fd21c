"""Adapter helpers, the verl sampler's input checks, and TRL against a real selector service.

TRL is tested with its real classes (``RepeatSampler`` for the index pattern, ``GRPOTrainer`` for real
training steps on a tiny random model). The verl, AReaL and OpenRLHF adapters run inside those
frameworks' own training code in tests/integrations/test_frameworks.py; here only the verl sampler's refusals of
bad input, which need no verl, and the OpenRLHF adapter's sampler, reporter and command line.
"""

from __future__ import annotations

import importlib
import importlib.util
import types
from collections import Counter
from collections.abc import Iterable
from typing import Any

import httpx
import pytest
import torch

from rlvr_selector_client.client import DatasetInfo, Result, SelectorClient
from rlvr_selector_client.integrations import check_permutation, first_step, framework_version, group_results
from rlvr_selector_client.integrations import verl as verl_adapter
from tests.integrations.frameworks import common
from tests.utils import tiny_llama_config

# verl's datasets are `datasets.Dataset` frames; TRL brings `datasets` along.
needs_datasets = pytest.mark.skipif(
    importlib.util.find_spec("datasets") is None, reason="needs the `datasets` package (pip install trl)"
)
needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs TRL (pip install trl)")

# --------------------------------------------------------------------------------------------------
# Shared helpers (no service)
# --------------------------------------------------------------------------------------------------


def test_group_results_groups_in_order_and_rejects_bad_input() -> None:
    results = group_results([4, 2, 4, 2, 4], [1, 0, 0.5, 0, 1])
    assert [(r.prompt_id, list(r.rewards)) for r in results] == [(4, [1.0, 0.5, 1.0]), (2, [0.0, 0.0])]
    with pytest.raises(ValueError, match="2 prompt ids but 1 rewards"):
        group_results([1, 2], [1.0])
    with pytest.raises(ValueError, match="not finite"):
        group_results([1], [float("nan")])


def test_check_permutation() -> None:
    assert check_permutation([2, 0, 1], "ids") == {2: 0, 0: 1, 1: 2}
    with pytest.raises(ValueError, match=r"outside 0\.\.2"):
        check_permutation([0, 1, 3], "ids")
    with pytest.raises(ValueError, match="appears in rows 0 and 2"):
        check_permutation([1, 0, 1], "ids")
    with pytest.raises(ValueError, match="integer id"):
        check_permutation([0, None], "ids")


def test_request_ids_are_stable_in_their_values() -> None:
    """Resumed runs resend their reports under these ids, so the layout may not drift."""
    from rlvr_selector_client.integrations import request_id

    assert request_id("run", 3) == "run-s3"
    assert request_id("run", 3, prompt=7) == "run-s3-p7"
    assert request_id("run", 3, rank=1) == "run-s3-r1"
    assert request_id("run", 3, rank=1, round_index=2) == "run-s3-r1-d2"
    assert request_id("run", 3, sequence=4) == "run-g4-s3"
    # Several prompts: a digest of the distinct ids, whatever their order.
    assert (
        request_id("run", 3, prompts=[2, 1, 2])
        == request_id("run", 3, prompts=[1, 2])
        == "run-s3-649fb86e33eb"
    )
    assert request_id("run", 3, prompts=[1, 3]) != request_id("run", 3, prompts=[1, 2])
    # One prompt's report from a step's share (slime) keeps the digest form.
    assert request_id("run", 7, prompts=[5]) == "run-s7-b7d55bf47057"


def test_framework_version_reads_releases_of_any_build(monkeypatch: pytest.MonkeyPatch) -> None:
    for installed, expected in (
        ("0.9.1", (0, 9)),
        ("0.9.0rc1", (0, 9)),
        ("0.8.0+cu124", (0, 8)),
        ("1", (1, 0)),
    ):
        monkeypatch.setattr(verl_adapter.metadata, "version", lambda name, v=installed: v)
        assert framework_version("verl") == expected
    monkeypatch.undo()
    assert framework_version("no-such-package-installed") is None


def _info(open_step: int | None, observations: int | None) -> DatasetInfo:
    return DatasetInfo(
        "d", 4, 8, 1.0, (1.0, 1.0), 1.0, 0.7, "binary", {}, open_step=open_step, observations=observations
    )


def test_first_step_continues_after_an_earlier_run() -> None:
    assert first_step(_info(None, None)) == 0
    assert first_step(_info(3, 0)) == 3
    assert first_step(_info(3, 5)) == 4  # continue after a used step
    assert first_step(_info(3, 5), 9) == 9  # an explicit start wins


# --------------------------------------------------------------------------------------------------
# Service fixtures
# --------------------------------------------------------------------------------------------------


class RecordingClient(SelectorClient):
    """The real client, remembering every selection it received and every observe it sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.observed: list[tuple[int, str, list[Result]]] = []
        self.selected_steps: list[int | None] = []
        self.selected: dict[int, list[int]] = {}
        self.select_calls = 0

    def select(self, dataset: str, step: int, *args: Any, **kwargs: Any) -> Any:
        selection = super().select(dataset, step, *args, **kwargs)
        self.select_calls += 1
        self.selected[step] = list(selection.prompt_ids)
        return selection

    def observe(
        self,
        dataset: str,
        step: int,
        results: Iterable[Result],
        request_id: str,
        selected_step: int | None = None,
    ) -> Any:
        results = list(results)
        ack = super().observe(dataset, step, results, request_id, selected_step=selected_step)
        self.observed.append((step, request_id, results))
        self.selected_steps.append(selected_step)
        return ack


@pytest.fixture
def client(service: Any) -> Iterable[RecordingClient]:
    with RecordingClient(service.url, timeout=30.0) as c:
        yield c


# --------------------------------------------------------------------------------------------------
# verl (contract test)
# --------------------------------------------------------------------------------------------------


def verl_rows(ids: list[int | None]) -> list[dict[str, Any]]:
    """Rows as verl's RLHFDataset returns them (only the field the sampler reads)."""
    return [{"extra_info": {"split": "train"} if i is None else {"split": "train", "index": i}} for i in ids]


def verl_config(url: str, dataset: str, batch_size: int, **selector: Any) -> dict[str, Any]:
    return {
        "train_batch_size": batch_size,
        "dataloader_num_workers": 0,
        "sampler": {"selector": {"url": url, "dataset": dataset, "strategy": "insight", **selector}},
    }


def test_verl_sampler_refuses_rows_without_extra_info_index(service: Any, dsname: str) -> None:
    with pytest.raises(ValueError, match=r"row 2 .* no extra_info.index; verl would silently use 0"):
        verl_adapter.SelectorCurriculumSampler(
            verl_rows([0, 1, None, 3]), verl_config(service.url, dsname, 2)
        )


@pytest.mark.parametrize(
    ("ids", "overrides", "message"),
    [
        ([0, 1, 1, 2], {}, "appears in rows 1 and 2"),
        ([0, 1, 2, 7], {}, "outside 0..3"),
        ([0, 1, 2, 3], {"dataloader_num_workers": 8}, "dataloader_num_workers=0"),
        ([0, 1, 2, 3], {"train_batch_size": 5}, "exceeds the 4 prompts"),
    ],
)
def test_verl_sampler_configuration_errors(
    service: Any, dsname: str, ids: list[int], overrides: dict[str, Any], message: str
) -> None:
    config = verl_config(service.url, dsname, 2) | overrides
    with pytest.raises(ValueError, match=message):
        verl_adapter.SelectorCurriculumSampler(verl_rows(ids), config)


def test_verl_options_from_environment_and_unknown_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SELECTOR_URL", "http://selector:8000")
    monkeypatch.setenv("SELECTOR_DATASET", "from-env")
    monkeypatch.setenv("SELECTOR_SEED", "7")
    settings = verl_adapter.resolve_options({"strategy": "dps"}, __import__("os").environ)
    assert (settings.url, settings.dataset, settings.strategy, settings.seed) == (
        "http://selector:8000",
        "from-env",
        "dps",
        7,
    )
    with pytest.raises(ValueError, match="unknown key"):
        verl_adapter.resolve_options({"url": "u", "dataset": "d", "stratgey": "dps"}, {})
    with pytest.raises(ValueError, match=r"data.sampler.selector.url \(or env SELECTOR_URL\)"):
        verl_adapter.resolve_options({"dataset": "d"}, {})


def test_verl_version_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verl_adapter.metadata, "version", lambda name: "0.9.1")
    with pytest.raises(RuntimeError, match=r"rlvr_selector_client\.integrations\.verl_main"):
        verl_adapter._check_verl_version(trainer_reports=False)
    verl_adapter._check_verl_version(trainer_reports=True)
    monkeypatch.setattr(verl_adapter.metadata, "version", lambda name: "0.7.1")
    verl_adapter._check_verl_version(trainer_reports=False)
    monkeypatch.setattr(verl_adapter.metadata, "version", lambda name: "0.4.0")
    with pytest.raises(RuntimeError, match="too old"):
        verl_adapter._check_verl_version(trainer_reports=False)


def test_verl_v1_sampler_steps_are_training_batches_and_tag_each_row(service: Any, dsname: str) -> None:
    """On the v1 route verl fetches one prompt at a time (gen_batch_size=1) but a service step is still
    a training batch, and every row handed out is queued with its step and prompt id."""
    config = verl_config(service.url, dsname, 1) | {"gen_batch_size": 1}
    sampler = verl_adapter.SelectorCurriculumSampler(
        verl_rows([3, 0, 2, 1, 5, 4, 8, 6, 7]), config, step_size=3, report_groups=True, max_lag=4
    )
    it = iter(sampler)
    rows = [next(it) for _ in range(4)]
    issued = sampler.take_issued(4)
    assert [item.step for item in issued] == [0, 0, 0, 1]
    assert [item.prompt_id for item in issued] == [sampler.prompt_of[row] for row in rows]
    assert len({item.prompt_id for item in issued[:3]}) == 3
    assert all(item.rollouts is None for item in issued)
    with pytest.raises(RuntimeError, match="dataloader_num_workers=0"):
        sampler.take_issued(1)
    with SelectorClient(service.url) as c:
        assert c.get_dataset(dsname).max_lag == 4
    # A checkpoint in the middle of step 1: the resumed iterator skips the rest of that step (the
    # crashed run may have rolled it out) and selects step 2 next.
    state = it.state_dict()  # type: ignore[attr-defined]
    resumed = iter(sampler)
    resumed.load_state_dict(state)  # type: ignore[attr-defined]
    next(resumed)
    assert sampler.take_issued(1)[0].step == 2


def test_a_select_filter_in_the_options_reaches_every_select(service: Any, dsname: str) -> None:
    """``filter`` goes with each select the adapter makes: the service's filter keeps the prompts an
    upload says are solved out of the batch, names a bound it refuses, and refuses it with greso."""
    with SelectorClient(service.url) as c:
        c.create_dataset(dsname, 8, rollouts_per_prompt=4)
        c.upload_metadata(dsname, pass_rate=[1.0] * 4 + [0.5] * 4, pass_samples=[16] * 8)
    from rlvr_selector_client.client import InvalidRequest
    from rlvr_selector_client.integrations import SelectorOptions

    config = verl_config(service.url, dsname, 4, filter={})
    rows = iter(verl_adapter.SelectorCurriculumSampler(verl_rows(list(range(8))), config))
    assert sorted(next(rows) for _ in range(4)) == [4, 5, 6, 7]
    for strategy, value, says in (("insight", {"solved": 2}, "solved"), ("greso", {}, "greso")):
        config = verl_config(service.url, dsname, 4, filter=value, strategy=strategy)
        with pytest.raises(InvalidRequest, match=says):
            next(iter(verl_adapter.SelectorCurriculumSampler(verl_rows(list(range(8))), config)))
    with pytest.raises(ValueError, match="a mapping of the filter's settings"):
        SelectorOptions(url="u", dataset="d", filter=[0.5])


def test_verl_rollout_budget_is_refused_where_group_sizes_are_fixed(service: Any, dsname: str) -> None:
    config = verl_config(service.url, dsname, 2, rollout_budget=8, rollout_min=2)
    with pytest.raises(ValueError, match=r"rollout_budget=8 is not supported here: .*trainer.use_v1=True"):
        verl_adapter.SelectorCurriculumSampler(verl_rows([0, 1, 2, 3]), config)


def test_verl_v1_reports_keep_the_first_report_and_file_late_ones(service: Any, dsname: str) -> None:
    """A group reported again with other rewards (rolled out again after a resume) keeps its first
    report; one that finishes more than the dataset's max_lag steps after its selection (a response
    spanning several updates, a group re-issued after a resume) is filed at the open step with its
    selected_step, never lost; neither stops training."""
    from types import SimpleNamespace

    from rlvr_selector_client.integrations import SelectorOptions
    from rlvr_selector_client.integrations.verl_v1 import ReportingBuffer

    with SelectorClient(service.url) as c:
        c.create_dataset(dsname, 4, rollouts_per_prompt=2, max_lag=1)
        buffer = ReportingBuffer()
        buffer.selector_sampler = SimpleNamespace(  # type: ignore[assignment]
            client=c, run_id="run", options=SelectorOptions(url=service.url, dataset=dsname)
        )
        c.select(dsname, 0, 2, "uniform")
        buffer._report("u1", 0, 1, [1.0, 0.0])
        buffer._report("u1", 0, 1, [1.0, 0.0])  # the same group polled again: a duplicate
        buffer._report("u1", 0, 1, [0.0, 0.0])  # rolled out again: its first report stands
        c.select(dsname, 3, 2, "uniform")  # steps 0-2 close: step 0 is now 3 steps late
        buffer._report("u2", 0, 2, [1.0, 1.0])
        buffer._report("u2", 0, 2, [1.0, 1.0])  # polled again (or by the resumed process): a duplicate
        assert [r.get("duplicate") for r in buffer.reports[:2]] == [False, True]
        assert buffer.superseded == [(0, 1)] and buffer.lost == []
        assert [(r["lag"], r["duplicate"]) for r in buffer.reports[3:]] == [(3, False), (3, True)]
        belief = c.beliefs(dsname, [1, 2]).beliefs
        assert (belief[0].alpha, belief[0].beta) == (2.0, 2.0) and belief[1].observations == 1


def test_areal_workflow_files_a_group_finished_past_max_lag(service: Any, dsname: str) -> None:
    """AReaL's episodes finish whenever they finish: a group reported more than the dataset's max_lag
    steps after its selection is filed at the open step (selected_step), once, never lost."""
    import asyncio

    from rlvr_selector_client.integrations.areal import SelectorWorkflow

    with SelectorClient(service.url) as c:
        c.create_dataset(dsname, 4, rollouts_per_prompt=2, max_lag=1)
        c.select(dsname, 0, 2, "uniform")
        c.select(dsname, 4, 2, "uniform")  # step 0 is now 4 steps late
        workflow = SelectorWorkflow(
            None, url=service.url, dataset=dsname, group_size=2, run_id=f"late-{dsname}"
        )

        async def report() -> None:
            await workflow._report(0, 3, [1.0, 0.0])
            await workflow._report(0, 3, [1.0, 0.0])  # sent again: a duplicate, applied once
            await workflow.aclose()

        asyncio.run(report())
        assert workflow.lost == [] and workflow.reported == [(0, 3, 4), (0, 3, 4)]
        assert c.beliefs(dsname, [3]).beliefs[0].observations == 1


def test_selector_options_rollout_budget() -> None:
    from rlvr_selector_client.client import RolloutBudget
    from rlvr_selector_client.integrations import SelectorOptions

    options = SelectorOptions(url="u", dataset="d")
    assert options.rollouts() is None
    options.refuse_rollout_budget("never raised without a budget")
    options = SelectorOptions(
        url="http://selector:8000", dataset="d", rollout_budget="64", rollout_min=2, rollout_max=16
    )
    assert options.rollouts() == RolloutBudget(64, 2, 16, "posterior")
    # Adapters whose trainers roll out a fixed group per prompt refuse it when they connect.
    with pytest.raises(ValueError, match="rollout_budget=64 is not supported here"):
        options.connect()
    client = options.connect(per_prompt_rollouts=True)
    client.close()
    with pytest.raises(ValueError, match="below rollout_min"):
        SelectorOptions(url="u", dataset="d", rollout_budget=64, rollout_min=4, rollout_max=2)
    with pytest.raises(ValueError, match="positive"):
        SelectorOptions(url="u", dataset="d", rollout_budget=0)


def v1_config(mode: str = "sync", **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "trainer": {
            "v1": {
                "trainer_mode": mode,
                "sampler": {"max_off_policy_threshold": 8, "custom_sampler": {"path": None, "name": None}},
                "colocate_async": {"num_warmup_batches": 1},
                "separate_async": {"num_warmup_batches": 1.5},
            }
        },
        "algorithm": {
            "adv_estimator": "grpo",
            "filter_groups": {"enable": False, "max_inflight_gen_batches": 1},
        },
        "data": {"dataloader_num_workers": 0, "sampler": {"selector": {}}},
    }
    for dotted, value in extra.items():
        node = config
        *path, last = dotted.split("__")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return config


@pytest.mark.parametrize(
    ("mode", "extra", "lag"),
    [
        ("sync", {}, 0),
        ("sync", {"algorithm__filter_groups__enable": True}, 2),
        (
            "sync",
            {
                "algorithm__filter_groups__enable": True,
                "algorithm__filter_groups__max_inflight_gen_batches": 3,
            },
            4,
        ),
        ("colocate_async", {}, 1 + 8 + 1),
        ("colocate_async", {"trainer__v1__sampler__max_off_policy_threshold": 2}, 1 + 2 + 1),
        ("colocate_async", {"trainer__v1__sampler__max_off_policy_threshold": None}, 1 + 8 + 1),
        ("separate_async", {"algorithm__filter_groups__enable": True}, 2 + 8 + 1 + 1),
    ],
)
def test_verl_v1_default_max_lag(mode: str, extra: dict[str, Any], lag: int) -> None:
    from rlvr_selector_client.integrations.verl_v1 import default_max_lag

    assert default_max_lag(v1_config(mode, **extra)) == lag


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"trainer__v1__sampler__custom_sampler": {"path": "pkg://x", "name": "Buffer"}}, "custom_sampler"),
        ({"data__sampler__class_path": "pkg://rlvr_selector_client.integrations.verl"}, "0.5-0.7 route"),
        ({"data__dataloader_num_workers": 2}, "dataloader_num_workers must be 0"),
        (
            {"data__sampler__selector__rollout_budget": 32, "algorithm__adv_estimator": "gae"},
            "adv_estimator=gae",
        ),
        ({"data__sampler__selector__rollout_budget": 32, "data__sampler__selector__rollout_min": 1}, ">= 2"),
    ],
)
def test_verl_v1_refusals(extra: dict[str, Any], message: str) -> None:
    from rlvr_selector_client.integrations.verl_v1 import check_v1_config

    with pytest.raises(ValueError, match=message):
        check_v1_config(v1_config(**extra))
    check_v1_config(
        v1_config(data__sampler__selector__rollout_budget=32, data__sampler__selector__rollout_min=2)
    )


# --------------------------------------------------------------------------------------------------
# TRL (real classes)
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def trl_adapter() -> Any:
    if importlib.util.find_spec("trl") is None:
        pytest.skip("needs TRL (pip install trl)")
    return importlib.import_module("rlvr_selector_client.integrations.trl")


def _pattern(indices: list[int]) -> list[int]:
    """Relabel indices by first appearance, so two sequences with the same shape compare equal."""
    labels: dict[int, int] = {}
    return [labels.setdefault(i, len(labels)) for i in indices]


@pytest.mark.parametrize(("mini", "batch", "repeat"), [(2, 3, 4), (3, 2, 1), (1, 7, 2)])
def test_trl_sampler_keeps_repeat_samplers_shape(
    trl_adapter: Any, service: Any, client: RecordingClient, dsname: str, mini: int, batch: int, repeat: int
) -> None:
    data = list(range(15))
    client.create_dataset(dsname, len(data))
    ours = list(
        trl_adapter.SelectorRepeatSampler(
            data, mini, batch, repeat, client=client, dataset=dsname, strategy="uniform", seed=3
        )
    )
    from trl.trainer.utils import RepeatSampler

    theirs = list(RepeatSampler(data, mini, batch, repeat, seed=3))
    assert len(ours) == len(theirs) == len(RepeatSampler(data, mini, batch, repeat))
    chunk = mini * batch * repeat
    for start in range(0, len(ours), chunk):
        assert _pattern(ours[start : start + chunk]) == _pattern(theirs[start : start + chunk])
    # Each chunk is the service's batch for its step.
    assert len(client.selected) == len(ours) // chunk
    for step, start in enumerate(range(0, len(ours), chunk)):
        assert list(dict.fromkeys(ours[start : start + chunk])) == client.selected[step]


def test_trl_sampler_gives_every_rank_the_same_batches(
    trl_adapter: Any, service: Any, client: RecordingClient, dsname: str
) -> None:
    client.create_dataset(dsname, 20)
    ranks = [
        trl_adapter.SelectorRepeatSampler(
            range(20), 2, 4, 1, client=client, dataset=dsname, strategy="insight", seed=1, start_step=5
        )
        for _ in range(2)
    ]
    streams = [iter(r) for r in ranks]
    for _ in range(3):
        blocks = [[next(s) for _ in range(8)] for s in streams]
        assert blocks[0] == blocks[1]
        assert len(set(blocks[0])) == 4
    assert ranks[0].latest_step == ranks[1].latest_step == 7


def _tiny_model(vocab_size: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **tiny_llama_config(vocab_size, max_position_embeddings=128),
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


def _history(url: str, dataset: str) -> list[dict[str, Any]]:
    with httpx.Client(base_url=url, timeout=30) as http:
        answer = http.get(f"/datasets/{dataset}/history")
        answer.raise_for_status()
        return list(answer.json()["rows"])


def _grpo_args(tmp_path: Any, **overrides: Any) -> Any:
    from trl import GRPOConfig

    settings: dict[str, Any] = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_completion_length": 6,
        "learning_rate": 1e-2,
        "use_cpu": True,
        "bf16": False,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "seed": 0,
        "disable_tqdm": True,
    }
    return GRPOConfig(**(settings | overrides))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("steps_per_generation", "accumulation"),
    [(1, 1), (1, 2), (2, 1)],
    ids=["one-step-per-generation", "two-generations-per-update", "two-steps-per-generation"],
)
def test_trl_grpo_trainer_reports_each_generation_at_the_step_that_selected_it(
    trl_adapter: Any,
    service: Any,
    client: RecordingClient,
    dsname: str,
    tmp_path: Any,
    steps_per_generation: int,
    accumulation: int,
) -> None:
    """TRL's loader runs ahead of training (accelerate fetches a batch ahead, transformers an optimizer
    step's batches at once); the trainer still selects each step when it generates it, so every
    generation's rewards (the named reward function's, not the other one's) are reported at the step
    that selected them, on time, no step is selected that is not trained, and a second trainer on the
    dataset continues after the last step."""
    import datasets

    size, generations = 12, 2
    train = datasets.Dataset.from_list([{"prompt": f"what is {i} + 1?", "prompt_id": i} for i in range(size)])
    rewarded: list[list[tuple[int, float]]] = []

    def has_vowel(completions: list[str], prompt_id: list[int], **kwargs: Any) -> list[float]:
        rewards = [1.0 if any(c in "aeiou" for c in text) else 0.0 for text in completions]
        rewarded.append([(int(p), r) for p, r in zip(prompt_id, rewards, strict=True)])
        return rewards

    def length_bonus(completions: list[str], **kwargs: Any) -> list[float]:
        return [len(text) / 100 for text in completions]

    tokenizer = common.tokenizer()
    generations_run = 2 if accumulation == 1 else 4
    args = _grpo_args(
        tmp_path,
        steps_per_generation=steps_per_generation,
        gradient_accumulation_steps=accumulation,
        max_steps=generations_run * steps_per_generation // accumulation,
    )
    trainer = trl_adapter.SelectorGRPOTrainer(
        model=_tiny_model(len(tokenizer)),
        reward_funcs=[length_bonus, has_vowel],
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        selector=trl_adapter.SelectorOptions(client=client, dataset=dsname, strategy="insight", seed=2),
        observe_reward="has_vowel",
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()

    per_generation = args.generation_batch_size // generations
    # One select per generation, steps 0, 1, ...: none selected ahead and left untrained.
    assert sorted(client.selected) == list(range(generations_run)) == list(range(len(rewarded)))
    assert len(client.observed) == generations_run == trainer.selector_reports
    for generation, (step, request_id, results) in enumerate(client.observed):
        # Each report is the generation's has_vowel rewards, at the step that selected its prompts.
        assert step == generation and client.selected_steps[generation] == step
        assert sorted(r.prompt_id for r in results) == sorted(client.selected[step])
        assert len(results) == per_generation
        reported = sorted((r.prompt_id, reward) for r in results for reward in r.rewards)
        assert reported == sorted(rewarded[generation])
        assert request_id.endswith(f"-s{step}")
    info = client.get_dataset(dsname)
    assert info.size == size and info.rollouts_per_prompt == generations and info.max_lag == 0
    assert info.open_step == generations_run - 1
    assert info.rollouts == generations_run * per_generation * generations
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    # The service's step history: every closed step observed its whole batch, none late.
    rows = _history(service.url, dsname)
    assert [row["step"] for row in rows] == list(range(generations_run - 1))
    assert all(row["observed"] == per_generation and not row["late"] for row in rows)

    # A second trainer on the same dataset continues after the first run's steps.
    again = trl_adapter.SelectorGRPOTrainer(
        model=trainer.model,
        reward_funcs=has_vowel,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        selector=trl_adapter.SelectorOptions(client=client, dataset=dsname, strategy="insight"),
    )
    assert again._selector_next == info.open_step + 1


@pytest.mark.slow
def test_trl_trainer_resumed_from_a_checkpoint_continues_after_the_last_step(
    trl_adapter: Any, service: Any, client: RecordingClient, dsname: str, tmp_path: Any
) -> None:
    """``train(resume_from_checkpoint=...)``: transformers fast-forwards the loader over the trained
    batches, which are slots and select nothing; the resumed run's next generation selects the step after
    the last one the service saw, and reports it there."""
    import datasets

    train = datasets.Dataset.from_list([{"prompt": f"what is {i} + 1?", "prompt_id": i} for i in range(12)])

    def has_vowel(completions: list[str], **kwargs: Any) -> list[float]:
        return [1.0 if any(c in "aeiou" for c in text) else 0.0 for text in completions]

    tokenizer = common.tokenizer()

    def trainer(steps: int) -> Any:
        return trl_adapter.SelectorGRPOTrainer(
            model=_tiny_model(len(tokenizer)),
            reward_funcs=has_vowel,
            args=_grpo_args(tmp_path, max_steps=steps, save_strategy="steps", save_steps=1),
            train_dataset=train,
            processing_class=tokenizer,
            selector=trl_adapter.SelectorOptions(client=client, dataset=dsname),
        )

    trainer(2).train()
    assert sorted(client.selected) == [0, 1]
    resumed = trainer(3)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.state.global_step == 3
    # One more generation, at the step after the first run's last; its report there.
    assert sorted(client.selected) == [0, 1, 2] and client.select_calls == 3
    assert [step for step, _, _ in client.observed] == [0, 1, 2]


def test_trl_trainer_refuses_what_it_cannot_observe_rightly(
    trl_adapter: Any, service: Any, client: RecordingClient, dsname: str, tmp_path: Any
) -> None:
    """Several reward functions and none named; a group size other than the dataset's; a service URL with
    a path: each refused at construction, saying what to do."""
    import datasets

    from rlvr_selector_client.client import SelectorError

    train = datasets.Dataset.from_list([{"prompt": f"q{i}", "prompt_id": i} for i in range(8)])

    def accuracy(completions: list[str], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    def format_reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [1.0] * len(completions)

    def build(**kwargs: Any) -> Any:
        options = {"client": client, "dataset": dsname}
        settings = {
            "model": _tiny_model(len(common.SYMBOLS)),
            "reward_funcs": [format_reward, accuracy],
            "args": _grpo_args(tmp_path, max_steps=1),
            "train_dataset": train,
            "processing_class": common.tokenizer(),
        }
        options |= kwargs.pop("options", {})
        return trl_adapter.SelectorGRPOTrainer(
            selector=trl_adapter.SelectorOptions(**options), **(settings | kwargs)
        )

    with pytest.raises(
        ValueError, match=r"2 reward functions \['format_reward', 'accuracy'\].*observe_reward="
    ):
        build()
    with pytest.raises(ValueError, match="none of the reward functions"):
        build(observe_reward="acc")
    assert build(observe_reward="accuracy").observed_reward == 1
    assert build(options={"reward_key": "accuracy"}).observed_reward == 1
    client.delete_dataset(dsname)

    client.create_dataset(dsname, len(train), rollouts_per_prompt=4)
    with pytest.raises(
        ValueError, match=r"rollouts_per_prompt=4, but num_generations is 2.*Set num_generations to 4"
    ):
        build(observe_reward=1)
    with pytest.raises(
        ValueError, match="rollouts_per_prompt=8 in the selector options but num_generations is 2"
    ):
        build(observe_reward=1, options={"rollouts_per_prompt": 8})
    assert client.select_calls == 0

    with pytest.raises(
        SelectorError, match=r"/api is not the selector service's URL.*HTTP 404.*Check the URL"
    ):
        build(observe_reward=1, options={"client": None, "url": service.url + "/api", "dataset": "other"})


def test_check_url_tells_a_wrong_url_from_the_service(service: Any) -> None:
    """The service's root answers /healthz with its contract header; a path the service does not serve
    answers 404, and another web server answers without the header: both named, with what to do."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    from rlvr_selector_client.client import SelectorError

    class Other(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Other)
    Thread(target=other.serve_forever, daemon=True).start()
    try:
        with SelectorClient(service.url) as right:
            right.check_url()
        with SelectorClient(service.url + "/api") as wrong, pytest.raises(SelectorError, match="HTTP 404"):
            wrong.check_url()
        elsewhere = f"http://127.0.0.1:{other.server_address[1]}"
        with (
            SelectorClient(elsewhere) as wrong,
            pytest.raises(SelectorError, match="without the Selector-Contract"),
        ):
            wrong.check_url()
    finally:
        other.shutdown()


def test_open_dataset_checks_the_group_size_except_where_groups_have_their_own(
    service: Any, dsname: str
) -> None:
    from rlvr_selector_client.integrations import SelectorOptions, open_dataset

    with SelectorClient(service.url) as c:
        options = SelectorOptions(client=c, dataset=dsname)
        info = open_dataset(c, options, 6, 3, group_option="--group")
        assert (info.size, info.rollouts_per_prompt) == (6, 3)
        with pytest.raises(ValueError, match=r"rollouts_per_prompt=3, but --group is 5.*Set --group to 3"):
            open_dataset(c, options, 6, 5, group_option="--group")
        with pytest.raises(ValueError, match="has 6 prompts but the train dataset has 7 rows"):
            open_dataset(c, options, 7, 3)
        # On purpose: INSIGHT's k set by hand, or a rollout budget (groups of their own sizes).
        open_dataset(c, SelectorOptions(client=c, dataset=dsname, params={"k": 5}), 6, 5)
        budget = SelectorOptions(client=c, dataset=dsname, rollout_budget=12, rollout_min=2)
        open_dataset(c, budget, 6, 5)
        # Unknown group size: the declared one is checked instead.
        open_dataset(c, options, 6, None)
        declared = SelectorOptions(client=c, dataset=dsname, rollouts_per_prompt=4)
        with pytest.raises(ValueError, match="rollouts_per_prompt=3, but --declared is 4"):
            open_dataset(c, declared, 6, None, group_option="--declared")


def test_selector_options_read_the_environment_however_they_are_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlvr_selector_client.integrations import SelectorOptions

    monkeypatch.setenv("SELECTOR_URL", "http://s:1")
    monkeypatch.setenv("SELECTOR_DATASET", "from-env")
    monkeypatch.setenv("SELECTOR_STRATEGY", "dps")
    monkeypatch.setenv("SELECTOR_SEED", "7")
    monkeypatch.setenv("SELECTOR_MAX_LAG", "3")
    built = SelectorOptions()
    resolved = SelectorOptions.resolve({}, dict(__import__("os").environ))
    for options in (built, resolved):
        assert (options.url, options.dataset, options.strategy, options.seed, options.max_lag) == (
            "http://s:1",
            "from-env",
            "dps",
            7,
            3,
        )
    # Explicit values win, in both.
    explicit = {"url": "http://t:2", "dataset": "d", "strategy": "uniform", "seed": 0, "max_lag": 0}
    assert SelectorOptions(**explicit) == SelectorOptions.resolve(explicit, {"SELECTOR_SEED": "9"})
    assert SelectorOptions(**explicit).seed == 0
    monkeypatch.delenv("SELECTOR_STRATEGY")
    monkeypatch.delenv("SELECTOR_SEED")
    assert (SelectorOptions().strategy, SelectorOptions().seed) == ("uniform", 0)


def test_the_adapters_default_strategy_is_the_decision_tables_when_nothing_is_known() -> None:
    from rlvr_selector_client.integrations import DEFAULT_STRATEGY
    from rlvr_selector_client.recommend import Known, recommend

    for pool, epochs, batch in ((1_000, 0.1, 8), (2_000, 12, 32), (200_000, 0.5, 256), (50, 100, 50)):
        assert recommend(pool, epochs, batch, Known.nothing()).strategy == DEFAULT_STRATEGY


def test_trl_trainer_refuses_datasets_without_prompt_ids(
    trl_adapter: Any, service: Any, client: RecordingClient, dsname: str
) -> None:
    import datasets

    train = datasets.Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}])
    with pytest.raises(ValueError, match="no 'prompt_id' column"):
        trl_adapter.SelectorGRPOTrainer(
            model=None,
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            train_dataset=train,
            selector=trl_adapter.SelectorOptions(client=client, dataset=dsname),
        )


def test_observing_reward_explains_a_missing_id_column(trl_adapter: Any, client: RecordingClient) -> None:
    reward = trl_adapter.ObservingReward(
        lambda completions, **kw: [1.0] * len(completions), client=client, dataset="d"
    )
    with pytest.raises(KeyError, match=r"dataset\.map"):
        reward(prompts=["p"], completions=["c"])
    with pytest.raises(TypeError, match="reward model is not a verifier"):
        trl_adapter.ObservingReward(torch.nn.Linear(1, 1), client=client, dataset="d")


def test_observing_reward_refuses_prompts_that_were_not_selected(
    trl_adapter: Any, service: Any, client: RecordingClient, dsname: str
) -> None:
    client.create_dataset(dsname, 10)
    sampler = trl_adapter.SelectorRepeatSampler(
        range(10), 2, 3, 1, client=client, dataset=dsname, strategy="uniform"
    )
    picked = sampler.select_next()
    wrong = next(i for i in range(10) if i not in picked)
    reward = trl_adapter.ObservingReward(
        lambda completions, **kw: [1.0] * len(completions), client=client, dataset=dsname, sampler=sampler
    )
    with pytest.raises(RuntimeError, match="not one batch the service selected"):
        reward(prompts=["p", "p"], completions=["a", "b"], prompt_id=[wrong, wrong])
    # The selected prompts are accepted; None rewards (not applicable) are left out of the report.
    ok = trl_adapter.ObservingReward(
        lambda completions, **kw: [1.0, None] * (len(completions) // 2),
        client=client,
        dataset=dsname,
        sampler=sampler,
    )
    ids = [pid for pid in picked for _ in range(2)]
    assert ok(prompts=ids, completions=["x"] * len(ids), prompt_id=ids) == [1.0, None] * len(picked)
    (step, _, results), *_ = client.observed
    assert step == 0 and Counter(len(r.rewards) for r in results) == {1: len(picked)}


def test_observing_reward_files_a_batch_drawn_ahead_under_the_step_that_selected_it(
    trl_adapter: Any, service: Any, client: RecordingClient, dsname: str
) -> None:
    """A custom loop that draws the next step before rewarding the current one (as a prefetching loader
    does): each report still goes to the step whose select chose its prompts, late by one."""
    client.create_dataset(dsname, 12, rollouts_per_prompt=2, max_lag=1)
    sampler = trl_adapter.SelectorRepeatSampler(
        range(12), 2, 3, 1, client=client, dataset=dsname, strategy="uniform", seed=4
    )
    reward = trl_adapter.ObservingReward(
        lambda completions, **kw: [1.0] * len(completions), client=client, dataset=dsname, sampler=sampler
    )
    drawn = iter(sampler)
    batches = [[next(drawn) for _ in range(6)] for _ in range(2)]  # steps 0 and 1 drawn
    for step, rows in enumerate(batches):
        reward(prompts=rows, completions=["x"] * 6, prompt_id=rows)
        assert client.observed[step][0] == step == client.selected_steps[step]
        assert sorted({r.prompt_id for r in client.observed[step][2]}) == sorted(client.selected[step])
    with pytest.raises(RuntimeError, match="reported already"):
        reward(prompts=batches[0], completions=["x"] * 6, prompt_id=batches[0])


# --------------------------------------------------------------------------------------------------
# Shared options and the OpenRLHF adapter's pieces (OpenRLHF itself: tests/integrations/test_frameworks.py)
# --------------------------------------------------------------------------------------------------


def test_selector_options_need_a_dataset_and_a_way_to_reach_the_service() -> None:
    from rlvr_selector_client.integrations import SelectorOptions

    with pytest.raises(ValueError, match="dataset name"):
        SelectorOptions(url="http://selector:8000")
    with pytest.raises(ValueError, match="url"):
        SelectorOptions(dataset="d")
    options = SelectorOptions.resolve(
        {"dataset": "d", "seed": "3"}, {"SELECTOR_URL": "http://s:1"}, "--selector"
    )
    assert (options.url, options.dataset, options.seed, options.params) == ("http://s:1", "d", 3, {})
    with pytest.raises(ValueError, match=r"--selector\.dataset \(or env SELECTOR_DATASET\)"):
        SelectorOptions.resolve({}, {"SELECTOR_URL": "http://s:1"}, "--selector")


def test_openrlhf_command_line_splits_selector_options_from_openrlhf_arguments() -> None:
    from rlvr_selector_client.integrations import openrlhf as adapter

    values, rest = adapter.split_selector_args(
        [
            "--selector.url=http://s:1",
            "--actor.model_name_or_path",
            "m",
            "--selector.params",
            '{"temperature": 0.5}',
            "--selector.seed",
            "4",
            "--selector.create",
            "false",
            "--data.apply_chat_template",
        ]
    )
    assert values == {"url": "http://s:1", "params": {"temperature": 0.5}, "seed": 4, "create": False}
    assert rest == ["--actor.model_name_or_path", "m", "--data.apply_chat_template"]
    with pytest.raises(ValueError, match=r"unknown option --selector\.stratgey"):
        adapter.split_selector_args(["--selector.stratgey", "dps"])
    with pytest.raises(ValueError, match="JSON object"):
        adapter.split_selector_args(["--selector.params", "[1]"])
    with pytest.raises(ValueError, match="needs a value"):
        adapter.split_selector_args(["--selector.url"])
    # The options travel to the Ray trainer actor as one JSON variable.
    options = adapter.SelectorOptions(url="http://s:1", dataset="d", params={"k": 1}, max_lag=3)
    env = {adapter.OPTIONS_ENV: adapter._options_json(options)}
    assert adapter.options_from_env(env) == options


def test_openrlhf_sampler_and_reporter_report_each_group_for_the_step_it_was_selected_at(
    service: Any, dsname: str
) -> None:
    from rlvr_selector_client.integrations import SelectorOptions, ensure_dataset
    from rlvr_selector_client.integrations import openrlhf as adapter

    size, batch, n = 6, 2, 3
    prompts = [f"prompt {i}" for i in range(size)]
    ids = [4, 0, 5, 1, 3, 2]  # row r holds service prompt ids[r]
    with SelectorClient(service.url) as client:
        # uniform walks one permutation per epoch: steps 0 and 1 never share a prompt, so each group's
        # step is unambiguous (a prompt in flight twice may have its groups credited to either step)
        options = SelectorOptions(client=client, dataset=dsname, seed=1, strategy="uniform")
        start = ensure_dataset(client, options, size, n, max_lag=2)
        sampler = adapter.SelectorPromptSampler(
            prompts, ids, batch, client=client, options=options, start_step=start, run_id="r1"
        )
        reporter = adapter.GroupReporter(sampler, client=client, dataset=dsname, group_size=n)
        rows = iter(sampler)
        step0 = [next(rows), next(rows)]
        # Dynamic filtering pulls a replacement before step 0's groups are in: it opens step 1.
        step1_first = next(rows)
        assert sampler.next_step == 2
        fed: dict[int, list[float]] = {}
        for row, reward in ((step0[1], 1.0), (step1_first, 0.0), (step0[0], 1.0)):
            for k in range(n):
                value = reward if k else 1.0 - reward
                fed.setdefault(ids[row], []).append(value)
                reporter.add({"prompt": prompts[row], "scores": torch.tensor([value]), "reward": None})
        assert [(s, p) for s, p, _ in reporter.reported] == [
            (0, ids[step0[1]]),
            (1, ids[step1_first]),
            (0, ids[step0[0]]),
        ]
        assert [lag for *_, lag in reporter.reported] == [1, 0, 1]  # step 0's groups came after step 1 opened
        assert reporter.lost == [] and reporter.partial == {}
        beliefs = {b.prompt_id: (b.alpha, b.beta) for b in client.beliefs(dsname, sorted(fed)).beliefs}
        for pid, values in fed.items():
            wins = sum(v >= 1.0 for v in values)
            assert beliefs[pid] == pytest.approx((1.0 + wins, 1.0 + len(values) - wins))
        # A response for a prompt the selector never handed out, or without a reward, is refused.
        with pytest.raises(RuntimeError, match="never handed out"):
            for _ in range(n):
                reporter.add({"prompt": prompts[step0[0]], "scores": 1.0})
        with pytest.raises(RuntimeError, match=r"--reward\.remote_url"):
            reporter.add({"prompt": prompts[0], "scores": None, "reward": None})


def test_openrlhf_reporter_files_a_group_later_than_max_lag_at_the_open_step(
    service: Any, dsname: str
) -> None:
    """A group reported after later steps were selected (dynamic filtering pulls them while a step's
    groups run), more than the dataset's max_lag: the report names its selected_step, so the service
    files it at the open step instead of refusing it; nothing is lost and later groups go on."""
    from rlvr_selector_client.integrations import SelectorOptions, ensure_dataset
    from rlvr_selector_client.integrations import openrlhf as adapter

    prompts = [f"q{i}" for i in range(4)]
    with SelectorClient(service.url) as client:
        options = SelectorOptions(client=client, dataset=dsname)
        start = ensure_dataset(client, options, 4, 2, max_lag=0)
        sampler = adapter.SelectorPromptSampler(
            prompts,
            [0, 1, 2, 3],
            1,
            client=client,
            options=options,
            start_step=start,
            run_id=f"late-{dsname}",
        )
        reporter = adapter.GroupReporter(sampler, client=client, dataset=dsname, group_size=2)
        rows = iter(sampler)
        first, second = next(rows), next(rows)  # step 0, then step 1: with max_lag 0, step 0 is late
        for _ in range(2):
            reporter.add({"prompt": prompts[first], "scores": 1.0})
        assert reporter.lost == [] and reporter.reported == [(start, first, 1)]
        assert client.beliefs(dsname, [first]).beliefs[0].observations == 1
        for _ in range(2):
            reporter.add({"prompt": prompts[second], "scores": 0.0})
        assert reporter.lost == []
        assert reporter.reported[1] == (start + 1, second, 0)


def test_openrlhf_resumed_sampler_drops_rows_of_a_step_selected_before_the_checkpoint(
    service: Any, dsname: str
) -> None:
    from rlvr_selector_client.integrations import SelectorOptions, ensure_dataset
    from rlvr_selector_client.integrations import openrlhf as adapter

    prompts = [f"p{i}" for i in range(4)]
    with SelectorClient(service.url) as client:
        options = SelectorOptions(client=client, dataset=dsname)
        start = ensure_dataset(client, options, 4, 2)
        first = adapter.SelectorPromptSampler(
            prompts, [0, 1, 2, 3], 2, client=client, options=options, start_step=start, run_id="r"
        )
        rows = iter(first)
        next(rows)  # checkpoint taken here, one row of step 0 still to come
        saved_iter, saved = rows.state_dict(), first.state_dict()
        client.observe(dsname, 0, [Result(prompt_id=first.id_of_row[0], rewards=[1.0, 0.0])], request_id="x")
        resumed = adapter.SelectorPromptSampler(
            prompts,
            [0, 1, 2, 3],
            2,
            client=client,
            options=options,
            start_step=first_step(client.get_dataset(dsname)),
            run_id="r2",
        )
        resumed.load_state_dict(saved)
        assert resumed.run_id == "r" and resumed.next_step == 1
        again = iter(resumed)
        again.load_state_dict(saved_iter)
        next(again)
        # Not step 0's leftover row: a fresh selection at step 1.
        assert again.step == 1 and resumed.next_step == 2


def test_the_verl_entry_point_refuses_a_verl_without_the_names_it_replaces() -> None:
    """A verl that renamed `create_rl_sampler` (or whichever name the entry point replaces) stops the
    entry point at start instead of training with verl's own sampler and nothing reported."""
    module = types.ModuleType("verl.trainer.ppo.v1.trainer_base")
    with pytest.raises(RuntimeError, match=r"trainer_base\.create_rl_sampler"):
        verl_adapter.replace_name(module, "create_rl_sampler", object())
    module.create_rl_sampler = None
    verl_adapter.replace_name(module, "create_rl_sampler", 7)
    assert module.create_rl_sampler == 7


def test_launch_paths_of_earlier_releases_load_the_client_packages_adapters() -> None:
    """`python -m trainer_client.integrations.verl_main`, `...openrlhf`, verl's class path and slime's
    hooks, written for releases where the adapters lived in trainer_client, reach the same objects."""
    pairs = {
        "verl_main": ["main"],
        "openrlhf": ["main"],
        "verl": ["SelectorCurriculumSampler"],
        "slime": ["SelectorDataSource", "report_all_samples"],
    }
    for module, names in pairs.items():
        old = importlib.import_module(f"trainer_client.integrations.{module}")
        new = importlib.import_module(f"rlvr_selector_client.integrations.{module}")
        for name in names:
            assert getattr(old, name) is getattr(new, name), f"{module}.{name}"
