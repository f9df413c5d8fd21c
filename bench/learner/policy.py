"""The learner's policy: a small Llama-architecture transformer, its supervised pre-training (cached),
exact pass rates by teacher forcing, and a batched KV-cache sampler that is the trainer's rollout engine.

The policy is a Hugging Face ``LlamaForCausalLM`` built from a small config (about 0.5M parameters by
default), so the trainer's own GRPO update (``trainer_client.grpo.GRPOLearner``, which checks the
architecture's output head) trains it unchanged. It starts from supervised pre-training on the task
family (`pretrain`): a seeded run, cached outside the work tree under ``$RLVR_LEARNING_CACHE`` (default
``~/.cache/rlvr-selector/learning``) in a file named after a hash of everything that shapes it, so every
later benchmark run of the same configuration loads it in a second.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.learner.task import BOS, EOS, PAD, VOCAB_SIZE, CharTokenizer, Problem, answer_tokens, draw_problem
from bench.learner.task import prompt_tokens as task_prompt_tokens
from trainer_client.rollout import Completion, PromptRollouts, RolloutEngine, per_prompt_counts

#: Bumped when pre-training's code changes what it produces, so that old cache files are not reused.
PRETRAIN_VERSION = 2


@dataclass(frozen=True)
class ModelSpec:
    """The transformer's shape and its pre-training recipe (all of it goes into the cache key)."""

    hidden: int = 128
    layers: int = 3
    heads: int = 4
    ffn: int = 256
    max_positions: int = 40
    pretrain_steps: int = 2000
    pretrain_batch: int = 128
    pretrain_lr: float = 3e-3
    pretrain_seed: int = 0

    def config(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=self.hidden,
            intermediate_size=self.ffn,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.heads,
            max_position_embeddings=self.max_positions,
            pad_token_id=PAD,
            eos_token_id=EOS,
            bos_token_id=BOS,
            tie_word_embeddings=False,
        )

    def key(self) -> str:
        blob = json.dumps({"version": PRETRAIN_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("RLVR_LEARNING_CACHE", Path.home() / ".cache" / "rlvr-selector" / "learning"))


def new_model(spec: ModelSpec, seed: int = 0) -> Any:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(spec.config())
    model.eval()
    return model


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _teacher_batch(
    prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt + answer`` rows, their attention mask, and a mask of the positions whose
    NEXT token is an answer token (``[rows, width - 1]``)."""
    rows = len(prompts)
    width = max(len(p) + len(a) for p, a in zip(prompts, answers, strict=True))
    ids = torch.full((rows, width), PAD, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    predicts = torch.zeros((rows, width - 1), dtype=torch.bool)
    for row, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        tokens = [*prompt, *answer]
        ids[row, : len(tokens)] = torch.tensor(tokens)
        attention[row, : len(tokens)] = 1
        predicts[row, len(prompt) - 1 : len(tokens) - 1] = True
    return ids, attention, predicts


def pretrain(
    spec: ModelSpec, *, progress: Callable[[int, float], None] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Supervised pre-training on problems drawn from the whole family (cross-entropy on the answer
    and its EOS), AdamW with a one-cycle schedule. Returns the weights and a record of the run."""
    tokenizer = CharTokenizer()
    model = new_model(spec, spec.pretrain_seed)
    model.train()
    rng = random.Random(spec.pretrain_seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.pretrain_lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer,
        max_lr=spec.pretrain_lr,
        total_steps=spec.pretrain_steps,
        pct_start=max(0.05, 2 / spec.pretrain_steps),
    )
    started = time.perf_counter()
    losses = []
    for step in range(spec.pretrain_steps):
        problems = [draw_problem(rng) for _ in range(spec.pretrain_batch)]
        ids, attention, predicts = _teacher_batch(
            task_prompt_tokens(tokenizer, problems), answer_tokens(tokenizer, problems)
        )
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits[predicts], ids[:, 1:][predicts])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step, losses[-1])
    model.eval()
    record = {
        "spec": asdict(spec),
        "parameters": parameter_count(model),
        "seconds": time.perf_counter() - started,
        "final_loss": float(np.mean(losses[-20:])),
        "torch": torch.__version__,
    }
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, record


def pretrained_model(spec: ModelSpec, *, quiet: bool = False) -> tuple[Any, dict[str, Any]]:
    """The pre-trained policy for ``spec``, from the cache when it holds it (else trained and stored).
    Returns the model and the pre-training record (with ``cached``: whether it was loaded)."""
    folder = cache_dir()
    path = folder / f"pretrain-{spec.key()}.pt"
    model = new_model(spec)
    if path.exists():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(saved["state"])
        record = json.loads(saved["record"])
        return model, {**record, "cached": True, "path": str(path)}
    bar = None
    if not quiet:
        from tqdm import tqdm

        bar = tqdm(total=spec.pretrain_steps, desc="pre-training the policy (once)", unit="step")

    def progress(step: int, loss: float) -> None:
        if bar is not None:
            bar.update(1)
            if step % 20 == 0:
                bar.set_postfix(loss=f"{loss:.3f}")

    state, record = pretrain(spec, progress=progress)
    if bar is not None:
        bar.close()
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"state": state, "record": json.dumps(record)}, partial)
    os.replace(partial, path)  # atomic: concurrent runs never read half a file
    model.load_state_dict(state)
    return model, {**record, "cached": False, "path": str(path)}


@torch.no_grad()
def exact_pass_rates(
    model: Any,
    tokenizer: CharTokenizer,
    problems: Sequence[Problem],
    *,
    temperature: float = 1.0,
    chunk: int = 1024,
) -> np.ndarray:
    """Each problem's probability that one sampled completion is rewarded: the product, over the
    answer's tokens and its EOS, of the model's temperature-scaled probability of each (the verifier
    accepts exactly that token sequence; bench.learner.task). float64, one value per problem."""
    was_training = model.training
    model.eval()
    out = np.empty(len(problems), dtype=np.float64)
    try:
        for start in range(0, len(problems), chunk):
            part = problems[start : start + chunk]
            ids, attention, predicts = _teacher_batch(
                task_prompt_tokens(tokenizer, part), answer_tokens(tokenizer, part)
            )
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].double() / temperature
            logprobs = torch.log_softmax(logits, dim=-1).gather(2, ids[:, 1:, None])[..., 0]
            out[start : start + len(part)] = torch.exp((logprobs * predicts).sum(dim=1)).numpy()
    finally:
        model.train(was_training)
    return out


class KVCacheSampler(RolloutEngine):
    """Batched sampling from the policy itself with a key/value cache: one row per completion, prompts
    left-padded with explicit position ids (so every row's positions are those of the unpadded prompt,
    as in the trainer's right-padded update), one forward pass per generated token, stopping when
    every row has produced EOS or the cap. Reports each sampled token's log-prob under the distribution
    it was drawn from. Seeded: the same seed and calls give the same completions."""

    name = "kv-cache"

    def __init__(self, model: Any, tokenizer: CharTokenizer, *, seed: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def _sample_rows(
        self, rows: Sequence[Sequence[int]], max_new_tokens: int, temperature: float
    ) -> tuple[list[list[int]], list[list[float]]]:
        width = max(len(r) for r in rows)
        count = len(rows)
        ids = torch.full((count, width), PAD, dtype=torch.long)
        attention = torch.zeros((count, width), dtype=torch.long)
        for row, prompt in enumerate(rows):
            ids[row, width - len(prompt) :] = torch.tensor(list(prompt))
            attention[row, width - len(prompt) :] = 1
        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1].float()
            next_position = positions[:, -1:] + 1
            tokens = torch.zeros((count, 0), dtype=torch.long)
            logprobs = torch.zeros((count, 0), dtype=torch.float64)
            done = torch.zeros(count, dtype=torch.bool)
            for _ in range(max_new_tokens):
                if temperature > 0:
                    scaled = torch.log_softmax(logits.double() / temperature, dim=-1)
                    choice = torch.multinomial(scaled.exp(), 1, generator=self.generator)
                else:
                    scaled = torch.log_softmax(logits.double(), dim=-1)
                    choice = logits.argmax(dim=-1, keepdim=True)
                choice = torch.where(done[:, None], torch.full_like(choice, EOS), choice)
                tokens = torch.cat([tokens, choice], dim=1)
                logprobs = torch.cat([logprobs, scaled.gather(1, choice)], dim=1)
                done |= choice[:, 0] == EOS
                if bool(done.all()):
                    break
                attention = torch.cat([attention, torch.ones((count, 1), dtype=torch.long)], dim=1)
                out = self.model(
                    input_ids=choice,
                    attention_mask=attention,
                    position_ids=next_position,
                    past_key_values=cache,
                    use_cache=True,
                )
                cache = out.past_key_values
                logits = out.logits[:, -1].float()
                next_position = next_position + 1
        finally:
            self.model.train(was_training)
        kept_tokens, kept_logprobs = [], []
        for row_tokens, row_logprobs in zip(tokens.tolist(), logprobs.tolist(), strict=True):
            end = row_tokens.index(EOS) + 1 if EOS in row_tokens else len(row_tokens)
            kept_tokens.append(row_tokens[:end])
            kept_logprobs.append(row_logprobs[:end])
        return kept_tokens, kept_logprobs

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int | Sequence[int],
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
    ) -> list[PromptRollouts]:
        if top_p != 1.0:
            raise ValueError("the sampler draws from the full distribution (top_p must be 1)")
        counts = per_prompt_counts(n, len(prompts))
        if temperature == 0 and any(c != 1 for c in counts):
            raise ValueError("greedy decoding gives one completion per prompt")
        rows = [list(p) for p, c in zip(prompts, counts, strict=True) for _ in range(c)]
        tokens, logprobs = self._sample_rows(rows, max_new_tokens, temperature)
        results, start = [], 0
        for prompt, count in zip(prompts, counts, strict=True):
            completions = []
            for row_tokens, row_logprobs in zip(
                tokens[start : start + count], logprobs[start : start + count], strict=True
            ):
                finished = bool(row_tokens) and row_tokens[-1] == EOS
                completions.append(
                    Completion(
                        tuple(row_tokens),
                        self.tokenizer.decode(row_tokens, skip_special_tokens=True),
                        "stop" if finished else "length",
                        tuple(row_logprobs) if temperature > 0 else None,
                    )
                )
            start += count
            results.append(PromptRollouts(tuple(prompt), tuple(completions)))
        return results

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Nothing to do: the sampler runs the training model itself."""


def greedy_accuracy(engine: KVCacheSampler, problems: Sequence[Problem], max_new_tokens: int) -> float:
    """Share of ``problems`` whose greedy completion verifies."""
    from bench.learner.task import reward

    outputs = engine.generate(
        task_prompt_tokens(engine.tokenizer, problems), n=1, max_new_tokens=max_new_tokens, temperature=0.0
    )
    return float(np.mean([reward(p, o.completions[0].text) for p, o in zip(problems, outputs, strict=True)]))


def mixed_probability(p: np.ndarray, k: int) -> np.ndarray:
    """P(a group of k samples is mixed) at pass rate p: 1 - p^k - (1 - p)^k."""
    p = np.asarray(p, dtype=np.float64)
    return 1.0 - p**k - (1.0 - p) ** k


def log_every(total: int, points: int) -> list[int]:
    """Up to ``points`` step indices 1..total, evenly spaced, always ending at ``total``."""
    if total <= 0:
        return []
    every = max(1, math.ceil(total / points))
    marks = list(range(every, total + 1, every))
    return marks if marks and marks[-1] == total else [*marks, total]
