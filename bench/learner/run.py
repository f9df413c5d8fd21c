"""One strategy x seed run of the learning benchmark: GRPO on the small policy through the real stack.

The loop is the product's own trainer (``trainer_client.train.Trainer``: its select, rollout, reward,
observe and update steps, Dynamic Sampling included) with the service on its embedded store, the typed
client, and the trainer's GRPO update (``trainer_client.grpo``); only three things are the benchmark's:

- the rollout engine is `KVCacheSampler` on the policy itself (no vLLM for a model this small);
- ``oracle`` selects without the service: at every step it draws ``oracle_candidates x B`` prompts of the
  pool at random (as INSIGHT scores a candidate pool of 16 B; None: the whole pool), computes each one's
  exact current pass rate p (one teacher-forced pass; bench.learner.task says why it is exact) and takes
  the B most likely to give a mixed group, 1 - p^K - (1 - p)^K (ties broken at random). It still
  reports every group to the service, like any run. Its pass rates cost no rollouts: it is the ceiling
  of selection by pass rate, not a strategy one could run. With ``oracle_rule`` "filter" (the epochs
  regime) it is instead the filter with exact rates: uniform without repeats over the prompts whose
  current pass rate makes a mixed group at least ``oracle_mixed`` likely, the rates of the whole pool
  recomputed every ``eval_every`` steps;
- an arm with a profile (``filter``, ``filter_reprofile``) first rolls out ``profile_samples`` per prompt
  with the starting policy through the trainer's own profiling (trainer_client.profile) and uploads it;
  those rollouts count in the run's budget and its evaluations start at their cost;
- the run ends on rollouts, not steps: every strategy spends the regime's ``steps x B x K`` rollouts
  (Dynamic Sampling, which generates up to ``ds_oversample x ds_max_rounds`` times a batch per step, runs
  fewer steps), and it is evaluated each time its rollouts pass another ``eval_every x B x K``.

Evaluation, on held-out prompts drawn like the pool and never trained on: *sampled* accuracy is the mean
exact pass rate (the expected accuracy of one sample at the training temperature, free of sampling
noise), *greedy* the share solved by greedy decoding. The pool's sampled accuracy is measured on a
fixed subset of 500 pool prompts, to tell learning the pool from learning the task.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.learner.policy import (
    KVCacheSampler,
    exact_pass_rates,
    greedy_accuracy,
    mixed_probability,
    pretrained_model,
)
from bench.learner.regimes import ALL, Arm, Regime, arm_of
from bench.learner.task import MAX_NEW_TOKENS, PAD, ArithmeticTask, CharTokenizer, Problem, draw_problem

HOPELESS, SOLVED = 0.01, 0.99  # pass-rate bands of a regime's composition
POOL_PROBE = 500  # pool prompts whose accuracy is tracked


def band(p0: float) -> str:
    return "hopeless" if p0 < HOPELESS else "solved" if p0 > SOLVED else "middle"


def eighth(p0: float) -> str:
    """The bin of a histogram composition: round(8 p0), as a name."""
    return str(round(8 * p0))


def reference_rates(p0: np.ndarray, samples: int, seed: int) -> list[float]:
    """Each prompt's pass rate as `samples` draws from the starting policy estimate it (successes /
    samples): what a reference model's annotation gives, noisy where the exact p0 is not."""
    rng = np.random.default_rng([seed, samples, 0x5EED])
    return (rng.binomial(samples, np.clip(p0, 0.0, 1.0)) / samples).tolist()


def draw_sets(
    regime: Regime, seed: int, model: Any, tokenizer: CharTokenizer
) -> tuple[list[Problem], list[Problem], np.ndarray, np.ndarray]:
    """The pool and the held-out set of one seed (disjoint, no prompt twice), with each one's pass rates
    under the pre-trained policy. With a composition, problems are drawn until every band's quota is
    filled, in draw order, so the sets depend on the seed and the policy only."""
    rng = random.Random(f"learning-sets-{seed}")
    need = regime.pool_size + regime.heldout_size
    seen: set[str] = set()
    chosen: list[Problem] = []
    rates: list[float] = []
    shares = regime.composition
    binned = band
    if regime.histogram is not None:
        shares, binned = {str(i): float(x) for i, x in enumerate(regime.histogram)}, eighth
    if shares is None:
        while len(chosen) < need:
            problem = draw_problem(rng)
            if problem.prompt not in seen:
                seen.add(problem.prompt)
                chosen.append(problem)
        rates = list(exact_pass_rates(model, tokenizer, chosen))
    else:
        if regime.histogram is not None:
            total = sum(shares.values())
            quota = {k: round(v / total * need) for k, v in shares.items()}
            quota["4"] += need - sum(quota.values())
        else:
            quota = {
                "hopeless": round(shares.get("hopeless", 0.0) * need),
                "solved": round(shares.get("solved", 0.0) * need),
            }
            quota["middle"] = need - quota["hopeless"] - quota["solved"]
        filled = dict.fromkeys(quota, 0)
        for _ in range(200):
            batch = []
            while len(batch) < 2 * need:
                problem = draw_problem(rng)
                if problem.prompt not in seen:
                    seen.add(problem.prompt)
                    batch.append(problem)
            for problem, p0 in zip(batch, exact_pass_rates(model, tokenizer, batch), strict=True):
                name = binned(float(p0))
                if filled[name] < quota[name]:
                    filled[name] += 1
                    chosen.append(problem)
                    rates.append(float(p0))
            if filled == quota:
                break
        else:
            raise RuntimeError(
                f"regime {regime.name}: the family cannot fill the composition {shares} ({filled})"
            )
    # Interleave so that the pool and the held-out set share the composition: every k-th chosen problem
    # (k = need / heldout) is held out.
    order = np.random.default_rng([seed, 0x5E75]).permutation(need)
    held = set(order[: regime.heldout_size].tolist())
    pool = [p for i, p in enumerate(chosen) if i not in held]
    heldout = [p for i, p in enumerate(chosen) if i in held]
    p_all = np.asarray(rates)
    return pool, heldout, p_all[[i for i in range(need) if i not in held]], p_all[sorted(held)]


def dataset_name(regime: Regime, strategy: str, seed: int) -> str:
    """The dataset of one run: the regime's name made safe for the contract's pattern (letters, digits,
    ``._-``) and shortened, the strategy and the seed. Deterministic on purpose: the service seeds every
    random choice of a select by (dataset name, step, seed), so the same run draws the same batches."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", regime.name).strip("-.")[:60]
    return f"learn-{slug}-{strategy}-s{seed}"


def _trainer_class() -> type:
    """The trainer's loop with the benchmark's oracle and evaluation (imported late: torch)."""
    from trainer_client.train import Trainer

    class BenchTrainer(Trainer):  # type: ignore[misc, valid-type]
        def setup(self, regime: Regime, pool: list[Problem], heldout: list[Problem], seed: int) -> None:
            self.regime, self.pool, self.heldout = regime, pool, heldout
            self.oracle_rng = np.random.default_rng([seed, 0x0AC1E])
            self.rolled: list[int] = []
            #: (prompt, successes, group size) of every group trained on, in order (not the profile's).
            self.visits: list[tuple[int, int, int]] = []
            self.profiling = False
            self.probe = pool[:POOL_PROBE]
            self.oracle_queue: list[int] = []
            self.oracle_round: set[int] = set()
            self.oracle_value: np.ndarray | None = None
            self.oracle_eligible = np.empty(0, dtype=np.int64)

        def rollout(self, prompt_ids: Sequence[int], n: Any = None) -> Any:
            groups, gen_s, reward_s = super().rollout(prompt_ids, n)
            if not self.profiling:
                self.rolled.extend(int(i) for i in prompt_ids)  # every prompt rolled out, in order
                for group in groups:
                    wins = sum(r >= self.threshold for r in group.rewards)
                    self.visits.append((int(group.prompt_id), int(wins), len(group.rewards)))
            return groups, gen_s, reward_s

        def _oracle_filter(self, step: int) -> list[int]:
            """The filter with exact, fresh rates: uniform without repeats over the prompts whose current
            pass rate makes a mixed group at least ``oracle_mixed`` likely (Regime.oracle_rule)."""
            batch, refresh = self.config.batch_size, self.regime.eval_every
            if self.oracle_value is None or step % refresh == 0:
                rates = exact_pass_rates(self.learner.model, self.tokenizer, self.pool,
                                         temperature=self.regime.temperature)  # fmt: skip
                self.oracle_value = mixed_probability(rates, self.config.rollouts)
                self.oracle_eligible = np.flatnonzero(self.oracle_value >= self.regime.oracle_mixed)
                eligible = set(self.oracle_eligible.tolist())
                self.oracle_queue = [i for i in self.oracle_queue if i in eligible]
                fresh = sorted(eligible - self.oracle_round - set(self.oracle_queue))
                self.oracle_queue += [fresh[i] for i in self.oracle_rng.permutation(len(fresh))]
            chosen: list[int] = []
            eligible_all = self.oracle_eligible
            while len(chosen) < batch:
                if not self.oracle_queue:  # a round over every eligible prompt ends: the next begins
                    if len(eligible_all) <= len(chosen):
                        break
                    self.oracle_round = set()
                    self.oracle_queue = [int(i) for i in self.oracle_rng.permutation(eligible_all)]
                prompt = self.oracle_queue.pop(0)
                if prompt not in chosen:
                    chosen.append(prompt)
                    self.oracle_round.add(prompt)
            if len(chosen) < batch:  # too few eligible: the most likely mixed of the rest
                rest = np.setdiff1d(np.arange(len(self.pool)), chosen)
                order = np.lexsort((self.oracle_rng.random(len(rest)), self.oracle_value[rest]))[::-1]
                chosen += [int(rest[i]) for i in order[: batch - len(chosen)]]
            return chosen

        def _oracle_top(self) -> list[int]:
            """The B most likely mixed of ``oracle_candidates x B`` prompts drawn at random."""
            size, batch = len(self.pool), self.config.batch_size
            ratio = self.regime.oracle_candidates
            if ratio is not None and ratio * batch < size:
                candidates = np.sort(self.oracle_rng.choice(size, ratio * batch, replace=False))
            else:
                candidates = np.arange(size)
            rates = exact_pass_rates(
                self.learner.model,
                self.tokenizer,
                [self.pool[i] for i in candidates],
                temperature=self.regime.temperature,
            )
            value = mixed_probability(rates, self.config.rollouts)
            # Top B of the candidates by value, ties at random: sort by (value, random key), descending.
            order = np.lexsort((self.oracle_rng.random(len(candidates)), value))[::-1]
            return [int(candidates[i]) for i in order[:batch]]

        def _collect_selected(self, step: int, timings: dict[str, float]) -> Any:
            if self.config.strategy != "oracle":
                return super()._collect_selected(step, timings)
            chosen = self._oracle_filter(step) if self.regime.oracle_rule == "filter" else self._oracle_top()
            groups, gen_s, reward_s = self.rollout(chosen)
            timings["gen_s"] += gen_s
            timings["reward_s"] += reward_s
            observe_ms, duplicate = self.observe(step, groups, self._request_id(step))
            timings["observe_ms"] += observe_ms
            return groups, groups, duplicate

        def measure(self) -> dict[str, float]:
            model, temperature = self.learner.model, self.regime.temperature
            return {
                "heldout_sampled": float(
                    exact_pass_rates(model, self.tokenizer, self.heldout, temperature=temperature).mean()
                ),
                "heldout_greedy": greedy_accuracy(self.engine, self.heldout, MAX_NEW_TOKENS),
                "pool_sampled": float(
                    exact_pass_rates(model, self.tokenizer, self.probe, temperature=temperature).mean()
                ),
            }

    return BenchTrainer


def run_one(
    regime: Regime,
    strategy: str,
    seed: int,
    service_url: str,
    *,
    out: Path | None = None,
    threads: int = 1,
    progress: bool = False,
    arm: Arm | None = None,
) -> dict[str, Any]:
    """Run one arm x seed to the regime's rollout budget, its profile included; returns its evaluations
    and step records (and writes them as JSON to ``out`` when given). `strategy` names the arm (one of
    ``regimes.ALL``), or labels `arm` when given."""
    import torch

    from rlvr_selector_client.client import NotFound, SelectorClient
    from trainer_client.config import GRPOConfig, TrainConfig
    from trainer_client.grpo import GRPOLearner

    if arm is None:
        if strategy not in ALL:
            raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(ALL)}")
        arm = arm_of(regime, strategy)
    if arm.profile and regime.profile_samples * regime.pool_size >= regime.rollout_budget:
        raise ValueError(
            f"regime {regime.name}: a profile of {regime.profile_samples} x {regime.pool_size} prompts leaves no "
            f"rollout of its budget of {regime.rollout_budget:,} for training"
        )
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    started = time.perf_counter()
    tokenizer = CharTokenizer()
    model, pretrain_record = pretrained_model(regime.model, quiet=True)
    pool, heldout, p0_pool, _ = draw_sets(regime, seed, model, tokenizer)
    task = ArithmeticTask(pool)
    trainer_strategy, budgeted = arm.strategy, arm.budgeted
    B, K = regime.batch_size, regime.rollouts
    config = TrainConfig(
        dataset=dataset_name(regime, strategy, seed),
        strategy=trainer_strategy,
        steps=regime.steps,
        batch_size=B,
        rollouts=K,
        rollout_budget=B * K if budgeted else None,
        rollouts_min=regime.budget_min if budgeted else 2,
        rollouts_max=regime.budget_max if budgeted else None,
        rollout_policy=regime.budget_policy if budgeted else "posterior",
        seed=seed,
        max_new_tokens=MAX_NEW_TOKENS,
        strategy_params={**regime.params.get(trainer_strategy, {}), **arm.params},
        select_filter=arm.select_filter,
        ds_oversample=regime.ds_oversample,
        ds_max_rounds=regime.ds_max_rounds,
        grpo=GRPOConfig(
            lr=regime.lr,
            warmup_steps=regime.warmup_steps,
            loss_norm=regime.loss_norm,
            scale_by_std=regime.scale_by_std,
            temperature=regime.temperature,
            micro_batch_size=max(B * K, 1),
            share_prompt=False,
        ),
    )
    engine = KVCacheSampler(model, tokenizer, seed=seed)
    learner = GRPOLearner(model, config.grpo, pad_token_id=PAD)
    with SelectorClient(service_url, timeout=120.0) as client:
        with contextlib.suppress(NotFound):  # a run of the same name before: start afresh
            client.delete_dataset(config.dataset)
        info = client.create_dataset(config.dataset, len(pool), rollouts_per_prompt=K, **regime.dataset)
        if regime.metadata:
            client.upload_metadata(config.dataset, group=task.groups())
        if regime.reference_samples:
            p_ref = p0_pool
            if regime.reference_model is not None:  # shipped rates: another model's, not the policy's own
                reference, _ = pretrained_model(regime.reference_model, quiet=True)
                p_ref = exact_pass_rates(reference, tokenizer, pool, temperature=regime.temperature)
            client.upload_metadata(
                config.dataset, pass_rate=reference_rates(p_ref, regime.reference_samples, seed)
            )
        trainer = _trainer_class()(
            config,
            client=client,
            dataset_info=info,
            task=task,
            tokenizer=tokenizer,
            engine=engine,
            learner=learner,
        )
        trainer.setup(regime, pool, heldout, seed)
        evals = [{"step": 0, "rollouts": 0, **trainer.measure()}]
        profile = None
        if arm.profile:  # a counted phase: its rollouts are part of the run's budget
            from trainer_client.profile import profile_prompts, upload_profile

            trainer.profiling = True
            profile = profile_prompts(trainer, regime.profile_samples, progress=False)
            trainer.profiling = False
            upload_profile(client, config.dataset, profile)
            trainer.profile_rollouts = profile.rollouts
            evals.append({**evals[0], "rollouts": profile.rollouts})
        spent = trainer.profile_rollouts
        records: list[dict[str, Any]] = []
        mark = spent + regime.eval_every * B * K
        step = trainer.start_step
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(
                total=regime.rollout_budget, initial=spent, desc=f"{strategy} seed {seed}", unit="rollout"
            )
        while spent + trainer.total_rollouts < regime.rollout_budget:
            before = trainer.total_rollouts
            record = trainer.run_step(step)
            records.append(record)
            if bar is not None:
                bar.update(trainer.total_rollouts - before)
            total = spent + trainer.total_rollouts
            if total >= mark or total >= regime.rollout_budget:
                evals.append({"step": step + 1, "rollouts": total, **trainer.measure()})
                while mark <= total:
                    mark += regime.eval_every * B * K
            step += 1
        if bar is not None:
            bar.close()
        served = client.get_dataset(config.dataset)
        client.delete_dataset(config.dataset)
    result = {
        "strategy": strategy,
        "seed": seed,
        "regime": regime.name,
        "arm": arm.describe(regime.profile_samples),
        # Every rollout the run spent: its profile's and its steps'.
        "rollouts": spent + trainer.total_rollouts,
        "profiling_rollouts": spent,
        "profile_kept": None if profile is None else sum(0.0 < r < 1.0 for r in profile.pass_rate),
        "service_rollouts": served.rollouts,
        "visits": trainer.visits,
        "pool_p0": p0_pool.tolist(),
        # How the run spread its rollouts over the pool: distinct prompts, and the most visits of one.
        "distinct_prompts": len(set(trainer.rolled)),
        "most_visits": int(np.bincount(trainer.rolled).max()) if trainer.rolled else 0,
        "rolled_digest": hashlib.sha256(np.asarray(trainer.rolled, dtype=np.int64).tobytes()).hexdigest()[
            :16
        ],
        "evals": evals,
        "records": [_slim(r) for r in records],
        "seconds": time.perf_counter() - started,
        "pretrain": {k: pretrain_record[k] for k in ("parameters", "seconds", "final_loss", "cached")},
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result))
    return result


_KEEP = (
    "step", "rollouts", "total_rollouts", "effective_ratio", "all_solved_share", "none_solved_share",
    "trained_groups", "mean_reward", "updated", "grad_norm", "entropy", "mismatch_mean", "group_size_mean",
    "ds_rounds", "step_s", "profile_rollouts",
)  # fmt: skip


def _slim(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in _KEEP if k in record}


def rollouts_to_reach(
    evals: Sequence[dict[str, Any]], target: float, key: str = "heldout_sampled"
) -> float | None:
    """Rollouts at which the evaluated curve first reaches ``target`` (linear between evaluations), or
    None when it never does."""
    previous = None
    for point in evals:
        value = point[key]
        if value >= target:
            if previous is None or previous[key] >= target:
                return float(point["rollouts"])
            x0, y0 = previous["rollouts"], previous[key]
            return float(x0 + (target - y0) * (point["rollouts"] - x0) / (value - y0))
        previous = point
    return None
