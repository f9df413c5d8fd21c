"""verl and TRL adapters against a real selector service.

TRL is tested with its real classes (``RepeatSampler`` for the index pattern, ``GRPOTrainer`` for real
training steps on a tiny random model). verl does not install next to this project's pins, so its
adapter is tested against a contract test that replays verl 0.7's call sequence: a dataset whose rows
carry ``extra_info`` (and default a missing index to 0, as verl's ``RLHFDataset`` does), a
``num_workers=0`` dataloader with verl's collate rule, ``repeat(interleave=True)``, a batch reordering
like verl's sequence balancing, then ``sampler.update(batch)``.
"""

from __future__ import annotations

import importlib
import importlib.util
import random
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from trainer_client.client import DatasetInfo, Result, SelectorClient
from trainer_client.integrations import check_permutation, first_step, group_results
from trainer_client.integrations import verl as verl_adapter

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


def _info(open_step: int | None, observations: int | None) -> DatasetInfo:
    return DatasetInfo(
        "d", 4, 8, 1.0, (1.0, 1.0), 1.0, 0.7, "binary", {}, open_step=open_step, observations=observations
    )


def test_first_step_continues_after_an_earlier_run() -> None:
    assert first_step(_info(None, None)) == 0
    assert first_step(_info(3, 0)) == 3
    assert first_step(_info(3, 5)) == 4


# --------------------------------------------------------------------------------------------------
# Service fixtures
# --------------------------------------------------------------------------------------------------


class RecordingClient(SelectorClient):
    """The real client, remembering every selection it received and every observe it sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.observed: list[tuple[int, str, list[Result]]] = []
        self.selected: dict[int, list[int]] = {}
        self.select_calls = 0

    def select(self, dataset: str, step: int, *args: Any, **kwargs: Any) -> Any:
        selection = super().select(dataset, step, *args, **kwargs)
        self.select_calls += 1
        self.selected[step] = list(selection.prompt_ids)
        return selection

    def observe(self, dataset: str, step: int, results: Iterable[Result], request_id: str) -> Any:
        results = list(results)
        ack = super().observe(dataset, step, results, request_id)
        self.observed.append((step, request_id, results))
        return ack


@pytest.fixture
def client(service: Any) -> Iterable[RecordingClient]:
    with RecordingClient(service.url, timeout=30.0) as c:
        yield c


# --------------------------------------------------------------------------------------------------
# verl (contract test)
# --------------------------------------------------------------------------------------------------


class VerlLikeDataset:
    """The parts of verl's RLHFDataset the sampler and trainer touch: ``dataframe`` (a datasets.Dataset)
    and ``__getitem__`` that copies ``extra_info.index`` to ``index``, defaulting a missing one to 0."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        import datasets

        self.dataframe = datasets.Dataset.from_list(rows)

    def __len__(self) -> int:
        return len(self.dataframe)

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = dict(self.dataframe[item])
        if row.get("extra_info") is None:
            row["extra_info"] = {}
        row["index"] = row["extra_info"].get("index", 0)
        row["input_ids"] = torch.tensor([len(row["prompt"]), 1, 2])
        return row


def verl_collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """verl's rule: tensors are stacked, everything else becomes a numpy object array."""
    out: dict[str, Any] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        else:
            array = np.empty(len(values), dtype=object)
            array[:] = values
            out[key] = array
    return out


class DataProtoLike:
    """``batch`` (tensors) + ``non_tensor_batch`` (numpy object arrays), with verl's interleaved repeat."""

    def __init__(self, batch: dict[str, torch.Tensor], non_tensor_batch: dict[str, np.ndarray]) -> None:
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch

    @classmethod
    def from_single_dict(cls, data: dict[str, Any]) -> DataProtoLike:
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        return cls(tensors, {k: v for k, v in data.items() if k not in tensors})

    def repeat(self, repeat_times: int, interleave: bool = True) -> DataProtoLike:
        assert interleave
        return DataProtoLike(
            {k: v.repeat_interleave(repeat_times, dim=0) for k, v in self.batch.items()},
            {k: np.repeat(v, repeat_times, axis=0) for k, v in self.non_tensor_batch.items()},
        )

    def reorder(self, order: list[int]) -> None:
        self.batch = {k: v[order] for k, v in self.batch.items()}
        self.non_tensor_batch = {k: v[order] for k, v in self.non_tensor_batch.items()}


def verl_rows(ids: list[int | None]) -> list[dict[str, Any]]:
    rows = []
    for row, prompt_id in enumerate(ids):
        extra = {"split": "train"} if prompt_id is None else {"split": "train", "index": prompt_id}
        rows.append({"prompt": f"question {row}", "data_source": "unit", "extra_info": extra})
    return rows


def verl_config(url: str, dataset: str, batch_size: int, **selector: Any) -> dict[str, Any]:
    return {
        "train_batch_size": batch_size,
        "dataloader_num_workers": 0,
        "sampler": {
            "class_path": "pkg://trainer_client.integrations.verl",
            "class_name": "SelectorCurriculumSampler",
            "selector": {"url": url, "dataset": dataset, "strategy": "insight", **selector},
        },
    }


def verl_fit(sampler: Any, dataset: VerlLikeDataset, *, steps: int, n: int, reward_of) -> list[list[int]]:
    """verl 0.7's loop, reduced to what touches the sampler. Returns each step's prompt ids."""
    loader = DataLoader(
        dataset,
        batch_size=sampler.batch_size,
        sampler=sampler,
        num_workers=0,
        drop_last=True,
        collate_fn=verl_collate,
    )
    seen = []
    shuffle = random.Random(0)
    iterator = iter(loader)
    for _ in range(steps):
        batch = DataProtoLike.from_single_dict(next(iterator))
        batch = batch.repeat(n, interleave=True)
        ids = [int(i) for i in batch.non_tensor_batch["index"]]
        scores = torch.zeros(len(ids), 5)
        scores[:, -1] = torch.tensor([reward_of(pid, k % n) for k, pid in enumerate(ids)])
        batch.batch["token_level_scores"] = scores
        order = list(range(len(ids)))
        shuffle.shuffle(order)  # sequence balancing reorders rows across the step
        batch.reorder(order)
        sampler.update(batch=batch)
        seen.append(sorted(set(ids)))
    return seen


@needs_datasets
def test_verl_sampler_selects_by_extra_info_index_and_reports_every_group(
    service: Any, client: RecordingClient, dsname: str
) -> None:
    size, batch_size, n, steps = 12, 4, 3, 3
    ids = list(reversed(range(size)))  # extra_info.index differs from the row position
    dataset = VerlLikeDataset(verl_rows(ids))
    sampler = verl_adapter.SelectorCurriculumSampler(
        dataset, verl_config(service.url, dsname, batch_size, rollouts_per_prompt=n), client=client
    )
    assert len(sampler) == size
    assert client.get_dataset(dsname).size == size

    def reward_of(pid: int, k: int) -> float:
        return 1.0 if pid % 3 == 0 or (pid % 3 == 1 and k == 0) else 0.0

    seen = verl_fit(sampler, dataset, steps=steps, n=n, reward_of=reward_of)

    # Each step's rows are the service's selection for that step, keyed by extra_info.index.
    assert [step for step, _, _ in client.observed] == [0, 1, 2]
    for step, request_id, results in client.observed:
        assert request_id == f"{sampler.run_id}-s{step}"
        assert sorted(client.selected[step]) == seen[step] == sorted(r.prompt_id for r in results)
        for result in results:
            assert sorted(result.rewards) == sorted(reward_of(result.prompt_id, k) for k in range(n))

    info = client.get_dataset(dsname)
    assert info.observations == steps * batch_size
    assert info.rollouts == steps * batch_size * n
    # Beta posteriors moved by exactly what was reported.
    successes: dict[int, float] = defaultdict(float)
    trials: dict[int, int] = defaultdict(int)
    for _, _, results in client.observed:
        for r in results:
            successes[r.prompt_id] += sum(x >= 1.0 for x in r.rewards)
            trials[r.prompt_id] += len(r.rewards)
    beliefs = client.beliefs(dsname, sorted(trials)).beliefs
    for belief in beliefs:
        assert belief.alpha == pytest.approx(1.0 + successes[belief.prompt_id])
        assert belief.beta == pytest.approx(1.0 + trials[belief.prompt_id] - successes[belief.prompt_id])


@needs_datasets
def test_verl_sampler_resumes_after_the_last_reported_step(
    service: Any, client: RecordingClient, dsname: str
) -> None:
    dataset = VerlLikeDataset(verl_rows(list(range(8))))
    config = verl_config(service.url, dsname, 4)
    first = verl_adapter.SelectorCurriculumSampler(dataset, config, client=client)
    verl_fit(first, dataset, steps=2, n=2, reward_of=lambda pid, k: float(k))
    state = first.state_dict()
    assert state["next_step"] == 2

    resumed = verl_adapter.SelectorCurriculumSampler(dataset, config, client=client)
    resumed.load_state_dict(state)
    assert resumed.run_id == first.run_id
    verl_fit(resumed, dataset, steps=1, n=2, reward_of=lambda pid, k: float(k))
    assert [step for step, _, _ in client.observed] == [0, 1, 2]

    # A checkpoint taken mid-epoch restores the position instead of selecting new steps.
    iterator = iter(resumed)
    first_half = [next(iterator), next(iterator)]
    saved = iterator.state_dict()
    calls = client.select_calls
    restored = iter(resumed)
    restored.load_state_dict(saved)
    second_half = [next(restored), next(restored)]
    assert client.select_calls == calls  # the step in progress is not selected again
    assert second_half == [next(iterator), next(iterator)]
    assert sorted(first_half + second_half) == sorted(client.selected[3])


@needs_datasets
def test_verl_sampler_refuses_rows_without_extra_info_index(service: Any, dsname: str) -> None:
    dataset = VerlLikeDataset(verl_rows([0, 1, None, 3]))
    with pytest.raises(ValueError, match=r"row 2 .* no extra_info.index; verl would silently use 0"):
        verl_adapter.SelectorCurriculumSampler(dataset, verl_config(service.url, dsname, 2))


@needs_datasets
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
        verl_adapter.SelectorCurriculumSampler(VerlLikeDataset(verl_rows(ids)), config)


def test_verl_settings_from_environment_and_unknown_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SELECTOR_URL", "http://selector:8000")
    monkeypatch.setenv("SELECTOR_DATASET", "from-env")
    monkeypatch.setenv("SELECTOR_SEED", "7")
    settings = verl_adapter.SelectorSettings.resolve({"strategy": "dps"}, __import__("os").environ)
    assert (settings.url, settings.dataset, settings.strategy, settings.seed) == (
        "http://selector:8000",
        "from-env",
        "dps",
        7,
    )
    with pytest.raises(ValueError, match="unknown key"):
        verl_adapter.SelectorSettings.resolve({"url": "u", "dataset": "d", "stratgey": "dps"}, {})
    with pytest.raises(ValueError, match=r"data.sampler.selector.url \(or env SELECTOR_URL\)"):
        verl_adapter.SelectorSettings.resolve({"dataset": "d"}, {})


@needs_datasets
def test_verl_sampler_refuses_filtered_batches(service: Any, client: RecordingClient, dsname: str) -> None:
    dataset = VerlLikeDataset(verl_rows(list(range(6))))
    sampler = verl_adapter.SelectorCurriculumSampler(
        dataset, verl_config(service.url, dsname, 3), client=client
    )
    loader = DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=0, collate_fn=verl_collate)
    batch = DataProtoLike.from_single_dict(next(iter(loader))).repeat(2)
    keep = [
        i
        for i, pid in enumerate(batch.non_tensor_batch["index"])
        if pid != batch.non_tensor_batch["index"][0]
    ]
    batch.reorder(keep)  # DAPO-style filtering dropped the first group
    batch.batch["token_level_scores"] = torch.ones(len(keep), 2)
    with pytest.raises(RuntimeError, match="other prompts than the ones selected"):
        sampler.update(batch)
    assert client.observed == []


def test_verl_version_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verl_adapter.metadata, "version", lambda name: "0.9.1")
    with pytest.raises(RuntimeError, match=r"supports verl >=0\.5,<0\.8"):
        verl_adapter._check_verl_version()
    monkeypatch.setattr(verl_adapter.metadata, "version", lambda name: "0.7.1")
    verl_adapter._check_verl_version()


# --------------------------------------------------------------------------------------------------
# TRL (real classes)
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def trl_adapter() -> Any:
    if importlib.util.find_spec("trl") is None:
        pytest.skip("needs TRL (pip install trl)")
    return importlib.import_module("trainer_client.integrations.trl")


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


def _tiny_tokenizer() -> Any:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = ["<pad>", "<eos>", "<unk>", *"abcdefghijklmnopqrstuvwxyz0123456789 +-*/=?.:"]
    core = Tokenizer(models.WordLevel({s: i for i, s in enumerate(symbols)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def _tiny_model(vocab_size: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_generation", [1, 2])
def test_trl_grpo_trainer_trains_on_selected_prompts_and_reports_them(
    trl_adapter: Any,
    service: Any,
    client: RecordingClient,
    dsname: str,
    tmp_path: Any,
    steps_per_generation: int,
) -> None:
    import datasets
    from trl import GRPOConfig

    size, generations = 12, 2
    train = datasets.Dataset.from_list([{"prompt": f"what is {i} + 1?", "prompt_id": i} for i in range(size)])
    rewarded: list[list[int]] = []

    def has_vowel(completions: list[str], prompt_id: list[int], **kwargs: Any) -> list[float]:
        rewarded.append(list(prompt_id))
        return [1.0 if any(c in "aeiou" for c in text) else 0.0 for text in completions]

    def length_bonus(completions: list[str], **kwargs: Any) -> list[float]:
        return [len(text) / 100 for text in completions]

    tokenizer = _tiny_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=generations,
        steps_per_generation=steps_per_generation,
        max_completion_length=6,
        max_steps=2 * steps_per_generation,
        learning_rate=1e-2,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        seed=0,
        disable_tqdm=True,
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

    sampler = trainer._selector_sampler
    per_generation = args.generation_batch_size // generations
    assert sampler.batch_size == per_generation
    # Two generations, each a full selected batch, each reported once with every completion's reward.
    assert len(client.observed) == 2 == trainer.observing_reward.reports
    for generation, (step, request_id, results) in enumerate(client.observed):
        assert sorted(set(rewarded[generation])) == sorted(sampler.history[generation])
        assert sorted(r.prompt_id for r in results) == sorted(sampler.history[generation])
        assert all(len(r.rewards) == generations for r in results)
        assert request_id.endswith(f"-g{generation}-s{step}")
        # One batch ahead: with one optimisation step per generation the next step is already
        # selected when the rewards arrive; otherwise the report is filed under its own step.
        assert step == generation + (1 if steps_per_generation == 1 else 0)
    info = client.get_dataset(dsname)
    assert info.size == size and info.rollouts_per_prompt == generations
    assert info.rollouts == 2 * per_generation * generations
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))

    # A second trainer on the same dataset continues after the first run's steps.
    again = trl_adapter.SelectorGRPOTrainer(
        model=trainer.model,
        reward_funcs=has_vowel,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        selector=trl_adapter.SelectorOptions(client=client, dataset=dsname, strategy="insight"),
    )
    assert again._get_train_sampler().next_step == client.get_dataset(dsname).open_step + 1


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
