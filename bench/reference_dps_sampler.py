"""A dictionary-based DPS sampler built the way the DPS authors' released sampler is built: the baseline
that bench_scale.py compares the service's numba kernels against.

The released sampler (github.com/maoyixiu/DPS, recipe/dps/task_sampler.py, arXiv 2603.10887) keeps the
per-prompt hidden-Markov state of docs/methods.md §2 in Python dictionaries keyed by the prompt index as
a string, with one small numpy array per prompt and entry, and updates them in a Python loop over every
prompt, every step. This module re-implements that design (our code, written from its structure):

    alphas[key]        float64[3, 3]  Dirichlet counts D, column-stochastic: P = D / D.sum(axis=0)
    priors[key]        float64[3]     belief for the next step (what selection ranks by)
    prev_posts[key]    float64[3]     posterior of the previous step (prev_post)
    times_sampled[key] int            observations received

- `select` ranks the candidates it is given: a Python loop fetches each candidate's belief (creating
  the entry at the prior the first time a prompt is seen) and its entropy, then `np.argsort` over the
  stacked scores keeps the `batch_size` largest prior(2) (+ entropy_weight * entropy). The released runs
  pass the whole dataset as candidates (candidate_ratio x batch >= dataset size), so after the first
  select every prompt has an entry.
- `train` (closing a step) turns each observed success rate into a state (0 -> unsolved, 1 -> solved,
  otherwise partially solved) and updates the observed prompts one by one, then loops over every known
  prompt that is not in the observed list (a membership test against the list of observed keys, as
  released) and applies the unobserved update. Every update builds new small numpy arrays: the expected
  transition matrix, the soft-count matrix xi, the decayed counts, the predicted belief.

The update rule is docs/methods.md §2 exactly, in float64. Differences from the service's kernel that do
not change the arithmetic: the service stores float32 and pools several results of one prompt at one
step into one state; this sampler updates once per (prompt, result) pair in the order given, so callers
that compare the two pass distinct prompt ids per step. Ties in `select` follow np.argsort's order
(the released code does not randomise them; the service must, docs/methods.md §2).

Per prompt and step this costs tens of microseconds and several hundred bytes of Python objects, which
is what bench_scale.py measures; tests/core/test_reference_sampler.py checks that it computes the same
beliefs as the service's close_step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["DictHMMSampler", "state_of_rate"]

NUM_STATES = 3


def state_of_rate(rate: float) -> int:
    """Solving state (1 unsolved, 2 partially solved, 3 solved) of a prompt's success rate in [0, 1]."""
    if rate == 0.0:
        return 1
    if rate == 1.0:
        return 3
    return 2


class DictHMMSampler:
    """Per-prompt Bayesian HMMs in dictionaries, updated by a Python loop over every prompt.

    `decay` is docs/methods.md §2's lam (hmm_decay); `prior_count` the value of every entry of D0 (the released
    scripts use 1.0); `entropy_weight` adds w_H * entropy(prior) to the score.
    """

    def __init__(self, batch_size: int, decay: float, prior_count: float = 1.0, entropy_weight: float = 0.0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must lie in [0, 1], got {decay}")
        if prior_count <= 0.0:
            raise ValueError(f"prior_count must be > 0, got {prior_count}")
        self.batch_size = batch_size
        self.decay = float(decay)
        self.entropy_weight = float(entropy_weight)
        self.prior_counts = np.full((NUM_STATES, NUM_STATES), float(prior_count))
        self.initial_belief = np.full(NUM_STATES, 1.0 / NUM_STATES)
        self.alphas: dict[str, np.ndarray] = {}
        self.priors: dict[str, np.ndarray] = {}
        self.prev_posts: dict[str, np.ndarray] = {}
        self.times_sampled: dict[str, int] = {}

    # ---- per-prompt entries -----------------------------------------------------------------------
    def entry(self, index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(D, prior, prev_post) of one prompt, created at the priors the first time it is seen."""
        key = str(index)
        if key not in self.alphas:
            self.alphas[key] = self.prior_counts
            self.priors[key] = self.initial_belief
            self.prev_posts[key] = self.initial_belief
            self.times_sampled[key] = 0
        return self.alphas[key], self.priors[key], self.prev_posts[key]

    def __len__(self) -> int:
        return len(self.alphas)

    # ---- the HMM arithmetic (docs/methods.md §2) -----------------------------------------------------------
    @staticmethod
    def expected_transitions(alpha: np.ndarray) -> np.ndarray:
        """P(i, j) = D(i, j) / sum_i D(i, j): the probability of moving from state j to state i."""
        return alpha / alpha.sum(axis=0, keepdims=True)

    def predict(self, alpha: np.ndarray, belief: np.ndarray) -> np.ndarray:
        """normalise(P @ belief): the belief one step later."""
        nxt = self.expected_transitions(alpha) @ belief
        return nxt / nxt.sum()

    def decayed_counts(
        self, alpha: np.ndarray, prev: np.ndarray, post: np.ndarray, weight: float
    ) -> np.ndarray:
        """lam D + (1 - lam) D0 + weight * xi, with xi(i, j) = post(i) P(i, j) prev(j) normalised to 1.

        weight = 1 for an observed prompt, 0 for an unobserved one (xi is still formed, as released)."""
        xi = np.outer(post, prev) * self.expected_transitions(alpha)
        xi = xi / xi.sum() * weight
        return alpha * self.decay + self.prior_counts * (1.0 - self.decay) + xi

    # ---- selection and step close -----------------------------------------------------------------
    def select(self, candidates: Sequence[int]) -> tuple[list[int], np.ndarray]:
        """The `batch_size` candidates with the largest score, best first, and all candidates' beliefs
        (float64[m, 3], in candidate order)."""
        if len(candidates) < self.batch_size:
            raise ValueError(f"{len(candidates)} candidates for a batch of {self.batch_size}")
        beliefs = []
        entropies = []
        for index in candidates:
            _, prior, _ = self.entry(index)
            beliefs.append(prior)
            entropies.append(-np.sum(prior * np.log(prior + 1e-10)))
        stacked = np.array(beliefs)
        scores = stacked[:, 1] + self.entropy_weight * np.array(entropies)
        order = np.argsort(-scores)[: self.batch_size]
        return [candidates[i] for i in order], stacked

    def train(self, indices: Iterable[int], rates: Iterable[float]) -> None:
        """Closes a step: the observed update for each (index, success rate) in order, then the
        unobserved update for every other known prompt."""
        indices = list(indices)
        for index, rate in zip(indices, rates, strict=True):
            key = str(index)
            alpha, _, prev = self.entry(key)
            post = np.zeros(NUM_STATES)
            post[state_of_rate(float(rate)) - 1] = 1.0
            alpha = self.decayed_counts(alpha, prev, post, 1.0)
            self.alphas[key] = alpha
            self.prev_posts[key] = post
            self.priors[key] = self.predict(alpha, post)
            self.times_sampled[key] += 1
        observed = [str(index) for index in indices]
        for key in self.alphas:
            if key in observed:
                continue
            alpha, prior, prev = self.entry(key)
            alpha = self.decayed_counts(alpha, prev, prior, 0.0)
            self.alphas[key] = alpha
            self.prev_posts[key] = prior
            self.priors[key] = self.predict(alpha, prior)

    # ---- views for comparisons --------------------------------------------------------------------
    def as_arrays(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(D as float64[n, 9] with D(i, j) at [p, 3*i + j], prior float64[n, 3], prev_post float64[n, 3])
        for prompts 0..n-1, the layout of the service's BeliefArrays."""
        d = np.empty((n, 9))
        prior = np.empty((n, 3))
        prev = np.empty((n, 3))
        for p in range(n):
            alpha, pr, pv = self.entry(p)
            d[p] = alpha.reshape(9)
            prior[p] = pr
            prev[p] = pv
        return d, prior, prev
