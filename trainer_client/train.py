"""The GRPO training loop, with the selector service choosing the prompts of every step.

One step, top to bottom (``Trainer.run_step``):

1. select   ``/select`` returns B prompt ids for this step (``--strategy``, seeded by ``--seed``);
            with ``--rollout-budget N`` it also returns each prompt's count n_i (summing to N).
2. rollout  the rollout engine samples K completions per prompt (or n_i for prompt i), in one call
            (vLLM, or transformers).
3. reward   the task's verifier scores every completion.
4. observe  ``/observe`` gets every group's K (or n_i) rewards under request id ``{run_id}-s{step}-r{rank}``;
            the client retries with the same id, so a retry is never counted twice, and a report whose
            outcome is unknown (the service away) is sent again until it is acknowledged
            (``observe_exactly_once``).
5. update   one GRPO update on the batch (trainer_client.grpo).
6. sync     the new weights are pushed into the rollout engine before the next step samples.

``--strategy dynamic_sampling`` (DAPO's filter, the oracle baseline of docs/methods.md §4) runs in the
trainer instead: it over-samples ``ds_oversample x B`` prompts uniformly (its own seeded epoch walk, a
shuffled data loader), rolls them all out, keeps groups whose rewards are not all equal, and repeats
(round r reports under ``{run_id}-s{step}-r{rank}-d{r}``) until it has B kept groups or ``ds_max_rounds``
rounds. Every rollout it generates is reported to ``/observe`` (real evidence) and counted as cost.

``--strategy speed_rl`` (SPEED-RL, docs/methods.md §7) runs in the trainer too, over the same walk and rounds:
each round screens its prompts with ``SPEED_INIT`` = 4 rollouts, gives those with 0 < S < 4 successes
``SPEED_CONT`` = 12 more (one group of 16), and fills the batch with them first in, first out. The round
reports every prompt it screened (with all 4 or 16 rewards) under ``-d{r}``: every rollout is evidence
and cost.

Per-step metrics (one JSON object per line in ``--metrics-out``):
    mean_reward      mean reward over all rollouts generated at the step
    solve_rate       share of those rollouts with reward >= the dataset's success threshold
    effective_ratio  share of generated groups whose rewards are not all equal (GRPO signal)
    rollouts         completions generated at the step (the cost); total_rollouts: cumulative
    profile_rollouts the dataset's profiling rollouts when the run started (``--profile-samples``, or
                     ``--pass-rates-profiled``; trainer_client.profile): spent before the first step and
                     not in total_rollouts; the run's rollouts in all are their sum
    group_size_min, group_size_mean, group_size_max, group_sizes
                     the generated groups' sizes (rollouts per prompt): min/mean/max and the number
                     of groups of each size (``{"2": 5, "16": 1}``; fixed K: ``{"K": groups}``)
    mixed_by_size    of those groups, how many were mixed, per size (same keys)
    updated          False when no trained group had a reward spread (no update, update fields null)
    mismatch_mean, mismatch_max
                     |log-prob of the trainer - log-prob of the rollout engine| per sampled token,
                     mean and max, before the update (null without engine log-probs, --backend hf)
    mismatch_kl      k3 estimate of KL(sampler || trainer) per token
    tis_weight_mean, tis_capped_frac
                     truncated importance weights min(pi_trainer / pi_sampler, --tis-cap): their mean
                     and the share of tokens whose ratio exceeded the cap
    clip_frac, kl, grad_norm, entropy
                     share of clipped token ratios, KL to the reference (null with --kl-coef 0), mean
                     pre-clip gradient norm, mean per-token entropy of the policy (nats)
    tokens, active_tokens: completion tokens of the trained groups, and those with a gradient
    select_ms, observe_ms (service round trips), gen_s, reward_s, train_s, sync_s, step_s
    eval_accuracy    (steps where ``--eval-every`` fires) greedy accuracy on a fixed prompt subset
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

import numpy as np

from rlvr_selector_client.client import DatasetInfo, Result, RolloutBudget, SelectorClient, first_step
from rlvr_selector_client.integrations import new_run_id, observe_exactly_once, request_id
from trainer_client.config import TrainConfig
from trainer_client.grpo import GRPOLearner, UpdateStats, build_samples
from trainer_client.model import encode_prompt
from trainer_client.rollout import PromptRollouts, RolloutEngine

__all__ = [
    "DYNAMIC_SAMPLING",
    "SPEED_RL",
    "TRAINER_STRATEGIES",
    "EpochWalk",
    "Group",
    "TrainConfig",
    "Trainer",
    "format_summary",
    "group_size_fields",
    "rollout_budget",
]

DYNAMIC_SAMPLING = "dynamic_sampling"
SPEED_RL = "speed_rl"
#: Strategies the trainer runs itself (everything else is a service strategy).
TRAINER_STRATEGIES = (DYNAMIC_SAMPLING, SPEED_RL)
#: SPEED-RL's screening rollouts and the rollouts added to a prompt the screen found mixed (docs/methods.md §7).
SPEED_INIT, SPEED_CONT = 4, 12


def rollout_budget(config: TrainConfig) -> RolloutBudget | None:
    """The rollout budget every select of the run asks for (``--rollout-budget``), or None."""
    if config.rollout_budget is None:
        return None
    return RolloutBudget(
        config.rollout_budget, config.rollouts_min, config.rollouts_max, config.rollout_policy
    )


def group_size_fields(sizes: Sequence[int], mixed: Sequence[bool]) -> dict[str, Any]:
    """A step record's summary of its groups' sizes: min/mean/max, groups per size and mixed groups
    per size (keys are the sizes as strings, ascending, as JSON object keys must be)."""
    counts: dict[int, int] = {}
    mixed_counts: dict[int, int] = {}
    for size, is_mixed in zip(sizes, mixed, strict=True):
        counts[size] = counts.get(size, 0) + 1
        mixed_counts[size] = mixed_counts.get(size, 0) + int(is_mixed)
    return {
        "group_size_min": min(sizes),
        "group_size_mean": statistics.fmean(sizes),
        "group_size_max": max(sizes),
        "group_sizes": {str(k): counts[k] for k in sorted(counts)},
        "mixed_by_size": {str(k): mixed_counts[k] for k in sorted(counts)},
    }


class TaskLike(Protocol):
    """What the loop needs from a task (``trainer_client.tasks.Task`` satisfies it)."""

    name: str
    system_prompt: str | None
    problems: Sequence[Any]  # each with a ``.prompt`` (the user message)

    def reward(self, index: int, completion: str) -> float: ...


@dataclass(frozen=True)
class Group:
    """One prompt's rollouts at a step and their rewards."""

    prompt_id: int
    rollouts: PromptRollouts
    rewards: tuple[float, ...]

    @property
    def mixed(self) -> bool:
        """True when the rewards are not all equal: the only groups with a GRPO gradient."""
        return max(self.rewards) != min(self.rewards)


class EpochWalk:
    """Uniform sampling without replacement, like a shuffled data loader: walks a fresh seeded
    permutation of ``0..n-1`` per epoch. ``take(m)`` returns ``min(m, n)`` distinct ids (a draw that
    crosses an epoch boundary skips ids already taken in that draw)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch, 0x5EED]).permutation(self.n)

    def take(self, count: int) -> list[int]:
        count = min(count, self.n)
        taken: list[int] = []
        seen: set[int] = set()
        while len(taken) < count:
            if self.position == self.n:
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            candidate = int(self._order[self.position])
            self.position += 1
            if candidate not in seen:
                seen.add(candidate)
                taken.append(candidate)
        return taken


class Trainer:
    """Runs ``config.steps`` GRPO steps; one instance per run."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        client: SelectorClient,
        dataset_info: DatasetInfo,
        task: TaskLike,
        tokenizer: Any,
        engine: RolloutEngine,
        learner: GRPOLearner,
        rank: int = 0,
    ) -> None:
        from trainer_client.config import RECOMMENDED

        if config.strategy == RECOMMENDED:
            raise ValueError(
                "strategy 'recommended' is chosen once the run's pool and pass rates are known: pass "
                "trainer_client.cli.recommended_config(config, num_prompts, metadata) or name a strategy"
            )
        self.config = config.validate(len(task.problems))
        if dataset_info.size != len(task.problems):
            raise ValueError(
                f"dataset {dataset_info.name!r} in the service has {dataset_info.size} prompts but the task "
                f"has {len(task.problems)}: use another --dataset name or the same --num-prompts"
            )
        self.client, self.dataset_info, self.task = client, dataset_info, task
        self.tokenizer, self.engine, self.learner, self.rank = tokenizer, engine, learner, rank
        self.threshold = dataset_info.success_threshold
        self.run_id = new_run_id(config.run_id, f"{config.strategy}-{config.seed}")
        self.start_step = first_step(dataset_info, config.start_step)
        self.total_rollouts = 0
        #: The dataset's profiling rollouts, spent before the first step (set by whoever profiled it).
        self.profile_rollouts = 0
        self._prompt_cache: dict[int, tuple[int, ...]] = {}
        self._walk = EpochWalk(len(task.problems), config.seed)
        eval_rng = np.random.default_rng([config.seed, 0xE7A1])
        eval_count = min(config.eval_size, len(task.problems))
        self.eval_ids = sorted(int(i) for i in eval_rng.choice(len(task.problems), eval_count, replace=False))

    # --- pieces of a step ------------------------------------------------------------------------
    def prompt_tokens(self, prompt_id: int) -> tuple[int, ...]:
        """Token ids of a prompt rendered with the chat template (cached)."""
        cached = self._prompt_cache.get(prompt_id)
        if cached is None:
            problem = self.task.problems[prompt_id]
            cached = encode_prompt(self.tokenizer, problem.prompt, self.task.system_prompt)
            self._prompt_cache[prompt_id] = cached
        return cached

    def rollout(
        self, prompt_ids: Sequence[int], n: int | Sequence[int] | None = None
    ) -> tuple[list[Group], float, float]:
        """Sample `n` (default K) completions per prompt, or ``n[i]`` for prompt i, in one engine call,
        and score them; returns (groups, gen seconds, reward seconds)."""
        started = time.perf_counter()
        outputs = self.engine.generate(
            [self.prompt_tokens(i) for i in prompt_ids],
            n=self.config.rollouts if n is None else n,
            max_new_tokens=self.config.max_new_tokens,
            temperature=self.config.grpo.temperature,
            top_p=self.config.top_p,
        )
        generated = time.perf_counter()
        groups = [
            Group(pid, out, tuple(float(self.task.reward(pid, c.text)) for c in out.completions))
            for pid, out in zip(prompt_ids, outputs, strict=True)
        ]
        return groups, generated - started, time.perf_counter() - generated

    def observe(self, step: int, groups: Sequence[Group], request_id: str) -> tuple[float, bool]:
        """Report every group's rewards, sent again while the service is away; returns (milliseconds,
        whether the service had acknowledged this request id before: a resumed run's report)."""
        started = time.perf_counter()
        ack = observe_exactly_once(
            self.client,
            self.dataset_info.name,
            step,
            [Result(prompt_id=g.prompt_id, rewards=list(g.rewards)) for g in groups],
            request_id,
        )
        return (time.perf_counter() - started) * 1000.0, ack.duplicate

    def evaluate(self) -> float:
        """Greedy accuracy (reward >= success threshold) on the fixed evaluation subset."""
        outputs = self.engine.generate(
            [self.prompt_tokens(i) for i in self.eval_ids],
            n=1,
            max_new_tokens=self.config.eval_max_new_tokens or self.config.max_new_tokens,
            temperature=0.0,
        )
        solved = sum(
            self.task.reward(pid, out.completions[0].text) >= self.threshold
            for pid, out in zip(self.eval_ids, outputs, strict=True)
        )
        return solved / len(self.eval_ids)

    def _request_id(self, step: int, round_index: int | None = None) -> str:
        return request_id(self.run_id, step, rank=self.rank, round_index=round_index)

    def _collect_selected(
        self, step: int, timings: dict[str, float]
    ) -> tuple[list[Group], list[Group], bool]:
        """Service strategies: one select, one rollout, one observe."""
        started = time.perf_counter()
        selection = self.client.select(
            self.dataset_info.name,
            step,
            self.config.batch_size,
            self.config.strategy,
            params=self.config.strategy_params or None,
            seed=self.config.seed,
            rollouts=rollout_budget(self.config),
            filter=self.config.select_filter,
        )
        timings["select_ms"] += (time.perf_counter() - started) * 1000.0
        counts = selection.rollouts
        if self.config.rollout_budget is not None and (
            counts is None or len(counts) != len(selection.prompt_ids)
        ):
            raise RuntimeError(
                f"the service answered a select with a rollout budget without one count per prompt "
                f"(got {counts!r} for {len(selection.prompt_ids)} prompts): it predates rollout budgets; "
                "upgrade it or drop --rollout-budget"
            )
        groups, gen_s, reward_s = self.rollout(selection.prompt_ids, counts)
        timings["gen_s"] += gen_s
        timings["reward_s"] += reward_s
        observe_ms, duplicate = self.observe(step, groups, self._request_id(step))
        timings["observe_ms"] += observe_ms
        return groups, groups, duplicate

    def _collect_dynamic(self, step: int, timings: dict[str, float]) -> tuple[list[Group], list[Group], bool]:
        """Dynamic Sampling: over-sample, keep mixed groups, repeat; report every rollout."""
        cfg = self.config
        generated: list[Group] = []
        kept: list[Group] = []
        duplicate = False
        rounds = 0
        while len(kept) < cfg.batch_size and rounds < cfg.ds_max_rounds:
            prompt_ids = self._walk.take(cfg.ds_oversample * cfg.batch_size)
            groups, gen_s, reward_s = self.rollout(prompt_ids)
            timings["gen_s"] += gen_s
            timings["reward_s"] += reward_s
            observe_ms, dup = self.observe(step, groups, self._request_id(step, rounds))
            timings["observe_ms"] += observe_ms
            duplicate |= dup
            generated.extend(groups)
            kept.extend(g for g in groups if g.mixed)
            rounds += 1
        timings["ds_rounds"] = rounds
        return generated, kept[: cfg.batch_size], duplicate

    def _collect_speed(self, step: int, timings: dict[str, float]) -> tuple[list[Group], list[Group], bool]:
        """SPEED-RL: screen with SPEED_INIT rollouts, continue the mixed prompts with SPEED_CONT more,
        fill the batch first in, first out; report every rollout."""
        cfg = self.config
        generated: list[Group] = []
        kept: list[Group] = []
        duplicate = False
        rounds = 0
        while len(kept) < cfg.batch_size and rounds < cfg.ds_max_rounds:
            screened, gen_s, reward_s = self.rollout(
                self._walk.take(cfg.ds_oversample * cfg.batch_size), SPEED_INIT
            )
            successes = [sum(r >= self.threshold for r in g.rewards) for g in screened]
            mixed = [g for g, s in zip(screened, successes, strict=True) if 0 < s < SPEED_INIT]
            more: list[Group] = []
            if mixed:
                more, more_gen_s, more_reward_s = self.rollout([g.prompt_id for g in mixed], SPEED_CONT)
                gen_s, reward_s = gen_s + more_gen_s, reward_s + more_reward_s
            timings["gen_s"] += gen_s
            timings["reward_s"] += reward_s
            grown = {
                g.prompt_id: Group(
                    g.prompt_id,
                    PromptRollouts(
                        g.rollouts.prompt_token_ids, g.rollouts.completions + m.rollouts.completions
                    ),
                    g.rewards + m.rewards,
                )
                for g, m in zip(mixed, more, strict=True)
            }
            groups = [grown.get(g.prompt_id, g) for g in screened]
            observe_ms, dup = self.observe(step, groups, self._request_id(step, rounds))
            timings["observe_ms"] += observe_ms
            duplicate |= dup
            generated.extend(groups)
            kept.extend(grown[g.prompt_id] for g in mixed)
            rounds += 1
        timings["ds_rounds"] = rounds
        return generated, kept[: cfg.batch_size], duplicate

    def run_step(self, step: int) -> dict[str, Any]:
        """One full step; returns its metrics record."""
        cfg = self.config
        step_started = time.perf_counter()
        timings: dict[str, float] = {"select_ms": 0.0, "observe_ms": 0.0, "gen_s": 0.0, "reward_s": 0.0}
        collect = {DYNAMIC_SAMPLING: self._collect_dynamic, SPEED_RL: self._collect_speed}.get(
            cfg.strategy, self._collect_selected
        )
        generated, trained, duplicate = collect(step, timings)

        started = time.perf_counter()
        samples = build_samples(
            [g.rollouts.prompt_token_ids for g in trained],
            [[c.token_ids for c in g.rollouts.completions] for g in trained],
            [g.rewards for g in trained],
            sampler_logprobs=[[c.logprobs for c in g.rollouts.completions] for g in trained],
            scale_by_std=cfg.grpo.scale_by_std,
            eps=cfg.grpo.adv_eps,
            group_weight=cfg.grpo.group_weight,
        )
        stats = self.learner.update(samples)
        train_s = time.perf_counter() - started
        started = time.perf_counter()
        if stats.updated:
            self.engine.sync_weights(self.learner.model.state_dict().items())
        sync_s = time.perf_counter() - started

        rewards = [r for g in generated for r in g.rewards]
        completions = [c for g in generated for c in g.rollouts.completions]
        self.total_rollouts += len(rewards)
        record: dict[str, Any] = {
            "step": step,
            "strategy": cfg.strategy,
            "run_id": self.run_id,
            "mean_reward": statistics.fmean(rewards),
            "solve_rate": sum(r >= self.threshold for r in rewards) / len(rewards),
            "effective_ratio": sum(g.mixed for g in generated) / len(generated),
            "all_solved_share": sum(min(g.rewards) >= self.threshold for g in generated) / len(generated),
            "none_solved_share": sum(max(g.rewards) < self.threshold for g in generated) / len(generated),
            "groups": len(generated),
            "trained_groups": len(trained),
            "rollouts": len(rewards),
            "total_rollouts": self.total_rollouts,
            "profile_rollouts": self.profile_rollouts,
            **group_size_fields([len(g.rewards) for g in generated], [g.mixed for g in generated]),
            "mean_completion_tokens": statistics.fmean(len(c.token_ids) for c in completions),
            "truncated_share": sum(c.finish_reason == "length" for c in completions) / len(completions),
            **_update_fields(stats),
            "observe_duplicate": duplicate,
            "select_ms": timings["select_ms"],
            "observe_ms": timings["observe_ms"],
            "gen_s": timings["gen_s"],
            "reward_s": timings["reward_s"],
            "train_s": train_s,
            "sync_s": sync_s,
        }
        if "ds_rounds" in timings:
            record["ds_rounds"] = int(timings["ds_rounds"])
        index = step - self.start_step + 1
        if cfg.eval_every and (index % cfg.eval_every == 0 or index == cfg.steps):
            record["eval_accuracy"] = self.evaluate()
        record["step_s"] = time.perf_counter() - step_started
        return record

    def run(
        self,
        sink: TextIO,
        *,
        progress: bool = True,
        on_record: Callable[[dict[str, Any]], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Run every step, writing one JSON line per step to ``sink`` (flushed, so a crash keeps the
        steps done). With ``--eval-every`` an evaluation before the first step is recorded on it as
        ``eval_accuracy_initial``."""
        from tqdm import tqdm

        records: list[dict[str, Any]] = []
        initial_eval = self.evaluate() if self.config.eval_every else None
        steps = range(self.start_step, self.start_step + self.config.steps)
        bar = tqdm(steps, desc=f"{self.config.strategy}", unit="step", disable=not progress, file=sys.stderr)
        for step in bar:
            record = self.run_step(step)
            if initial_eval is not None and not records:
                record["eval_accuracy_initial"] = initial_eval
            records.append(record)
            sink.write(json.dumps(record, sort_keys=False) + "\n")
            sink.flush()
            if on_record is not None:
                on_record(record)
            postfix = {"reward": f"{record['mean_reward']:.3f}", "eff": f"{record['effective_ratio']:.2f}"}
            if record["mismatch_mean"] is not None:
                postfix["mismatch"] = f"{record['mismatch_mean']:.2g}"
            bar.set_postfix(postfix)
        bar.close()
        return records


# Curves of the summary table: outcomes, then the update's diagnostics (steps without an update, or
# without the quantity, are left out of its first/last/mean).
SUMMARY_METRICS = (
    "mean_reward", "solve_rate", "effective_ratio", "mismatch_mean", "mismatch_max", "kl", "clip_frac",
    "grad_norm", "entropy",
)  # fmt: skip


def _update_fields(stats: UpdateStats) -> dict[str, Any]:
    """The per-step record's fields that describe the update (null where not measured)."""
    return {
        "updated": stats.updated,
        "optimizer_steps": stats.optimizer_steps,
        "tokens": stats.tokens,
        "active_tokens": stats.active_tokens,
        "mismatch_mean": stats.mismatch_mean,
        "mismatch_max": stats.mismatch_max,
        "mismatch_kl": stats.mismatch_kl,
        "tis_weight_mean": stats.tis_weight_mean,
        "tis_capped_frac": stats.tis_capped_frac,
        "clip_frac": stats.clip_frac,
        "kl": stats.kl,
        "grad_norm": stats.grad_norm,
        "entropy": stats.entropy,
    }


def _first_last(values: Sequence[float], window: int) -> tuple[float, float]:
    window = max(1, min(window, len(values) // 2 or 1))
    return statistics.fmean(values[:window]), statistics.fmean(values[-window:])


def format_summary(records: Sequence[Mapping[str, Any]], *, header: Mapping[str, Any]) -> str:
    """A plain-text table of a run: first/last/mean of the curves, costs and timings."""
    if not records:
        return "no steps were run"
    window = max(1, len(records) // 4)
    lines = [" ".join(f"{k}={v}" for k, v in header.items())]
    lines.append(
        f"{'metric':<18}{'first':>10}{'last':>10}{'mean':>10}   (first/last: mean of {window} step(s))"
    )
    for key in SUMMARY_METRICS:
        values = [float(r[key]) for r in records if r.get(key) is not None]
        if not values:
            continue
        first, last = _first_last(values, window)
        lines.append(f"{key:<18}{first:>10.4f}{last:>10.4f}{statistics.fmean(values):>10.4f}")
    evals = [r["eval_accuracy"] for r in records if "eval_accuracy" in r]
    if evals:
        initial = records[0].get("eval_accuracy_initial", math.nan)
        lines.append(
            f"{'eval_accuracy':<18}{initial:>10.4f}{evals[-1]:>10.4f}{'':>10}   (before / after training)"
        )
    total = sum(int(r["rollouts"]) for r in records)
    lines.append(f"rollouts: {total} total, {total / len(records):.1f} per step")
    profiled = int(records[0].get("profile_rollouts") or 0)
    if profiled:
        lines.append(f"profiling: {profiled} rollouts before the first step; {total + profiled} in all")
    sizes: dict[int, int] = {}
    for record in records:
        for size, count in (record.get("group_sizes") or {}).items():
            sizes[int(size)] = sizes.get(int(size), 0) + int(count)
    if len(sizes) > 1:  # per-prompt counts (a rollout budget)
        groups = sum(sizes.values())
        spread = ", ".join(f"{size}: {sizes[size]}" for size in sorted(sizes))
        lines.append(
            f"rollouts per prompt: min {min(sizes)}, mean {sum(k * v for k, v in sizes.items()) / groups:.2f}, "
            f"max {max(sizes)} (groups per size: {spread})"
        )
    median = statistics.median
    lines.append(
        "time per step (median): "
        f"select {median(r['select_ms'] for r in records):.1f} ms, "
        f"observe {median(r['observe_ms'] for r in records):.1f} ms, "
        f"generate {median(r['gen_s'] for r in records):.2f} s, "
        f"train {median(r['train_s'] for r in records):.2f} s, "
        f"sync {median(r['sync_s'] for r in records):.2f} s, "
        f"step {median(r['step_s'] for r in records):.2f} s"
    )
    return "\n".join(lines)
