"""Slow, obviously correct float64 twins of the selection kernels, written straight from docs/methods.md.

Each function here is the textbook formula with scipy special functions and literal Python loops, no
recurrences and no cleverness, so that a test comparing a fast kernel against its twin checks the
kernel's algebra and indexing. Twins are float64 throughout; where the service stores float32 (the HMM
arrays) the twin rounds once per step exactly where the stored state is written.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import betaln, comb, digamma, entr

EPS = np.finfo(np.float64).eps

# ---------------------------------------------------------------- outcomes (docs/methods.md §0)


def outcomes(rewards: list[list[float]], mode: str, threshold: float) -> tuple[list, list, list]:
    """(successes, trials, states) per result, one Python loop per reward list."""
    successes, trials, states = [], [], []
    for row in rewards:
        if mode == "binary":
            s = float(sum(1 for r in row if r >= threshold))
            state = 1 if s == 0 else 3 if s == len(row) else 2
        else:
            clipped = [min(max(r, 0.0), 1.0) for r in row]
            s = float(sum(clipped))
            if len(set(clipped)) > 1:
                state = 2
            elif clipped[0] >= 0.5:
                state = 3
            else:
                state = 1
        successes.append(s)
        trials.append(float(len(row)))
        states.append(state)
    return successes, trials, states


def combine_state(old: int, new: int) -> int:
    """Pooled state: what pooling S / trials of two binary results gives."""
    if old == 0:
        return new
    return old if old == new else 2


# ---------------------------------------------------------------- Beta family (docs/methods.md §1)


def beta_entropy(a, b):
    """H(a, b) = ln B(a, b) - (a-1) psi(a) - (b-1) psi(b) + (a+b-2) psi(a+b), nats."""
    return betaln(a, b) - (a - 1) * digamma(a) - (b - 1) * digamma(b) + (a + b - 2) * digamma(a + b)


def mutual_information(a, b, k: int):
    """I_K(a, b) = H(a, b) - sum_s P(S=s) H(a+s, b+K-s), P(s) = C(K,s) B(a+s, b+K-s) / B(a, b)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    total = beta_entropy(a, b)
    for s in range(k + 1):
        p = comb(k, s, exact=False) * np.exp(betaln(a + s, b + (k - s)) - betaln(a, b))
        total = total - p * beta_entropy(a + s, b + (k - s))
    return total


def mutual_information_rounding_scale(a, b, k: int):
    """Size of the largest terms the twin's formula adds and subtracts; its rounding error is a small
    multiple of EPS times this. For huge a, b the terms are ~a psi(a) ~ 1.4e7 while I_K ~ K / (2n), so
    the twin itself is only accurate to ~1e-9 absolute there (the fast kernel is far better)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)

    def terms(x, y):
        return (
            np.abs(betaln(x, y))
            + np.abs((x - 1) * digamma(x))
            + np.abs((y - 1) * digamma(y))
            + np.abs((x + y - 2) * digamma(x + y))
        )

    scale = terms(a, b)
    for s in range(k + 1):
        scale = np.maximum(
            scale, terms(a + s, b + (k - s)) + np.abs(betaln(a + s, b + (k - s)) - betaln(a, b))
        )
    return scale


def wmi_weight(m, eta: float, mu: float):
    """w(m) = m (1 - m) exp(-eta (m - mu)^2)."""
    return m * (1 - m) * np.exp(-eta * (m - mu) ** 2)


def wmi_scores(alpha, beta, ids, k: int, eta: float, mu: float):
    a, b = (alpha, beta) if ids is None else (alpha[ids], beta[ids])
    return wmi_weight(a / (a + b), eta, mu) * mutual_information(a, b, k)


def expected_difficulty(alpha, beta, ids, target: float):
    a, b = alpha[ids], beta[ids]
    return -((a / (a + b) - target) ** 2)


def inverse_evidence(alpha, beta, ids):
    return 1.0 / (alpha[ids] + beta[ids])


def apply_results(
    alpha, beta, step_state, last_state, n_obs, ids, successes, trials, states, beta_decay, alpha0, beta0
):
    """docs/methods.md §1 update, one result after another, plus state pooling and counters (in place)."""
    for p, s, t, st in zip(ids, successes, trials, states, strict=True):
        alpha[p] = beta_decay * alpha[p] + (1 - beta_decay) * alpha0 + s
        beta[p] = beta_decay * beta[p] + (1 - beta_decay) * beta0 + (t - s)
        step_state[p] = combine_state(int(step_state[p]), int(st))
        last_state[p] = st
        n_obs[p] = min(int(n_obs[p]) + 1, 2**31 - 1)


# ---------------------------------------------------------------- DPS (docs/methods.md §2)


def close_step(d, prior, prev, step_state, hmm_decay: float, d0: float = 1.0) -> tuple[int, ...]:
    """docs/methods.md §2 for every prompt, a literal per-prompt loop with 3x3 matrices (in place).

    d: f32[N, 9] with D(i, j) at [p, 3i + j]; prior, prev: f32[N, 3]; step_state: i8[N].
    Returns (observed, partial, correct, predicted_unsolved, predicted_partial, predicted_solved);
    argmax ties go to the lowest state (np.argmax does exactly that).
    """
    observed = partial = correct = 0
    predicted = [0, 0, 0]
    d0_matrix = np.full((3, 3), d0)
    for p in range(d.shape[0]):
        big_d = d[p].astype(np.float64).reshape(3, 3)
        belief = prior[p].astype(np.float64)
        transition = big_d / big_d.sum(axis=0, keepdims=True)  # P(i, j): from j to i
        o = int(step_state[p])
        if o:
            observed += 1
            partial += o == 2
            correct += int(np.argmax(belief)) == o - 1
            post = np.zeros(3)
            post[o - 1] = 1.0
            xi = np.outer(post, prev[p].astype(np.float64)) * transition
            xi /= xi.sum()
            big_d = hmm_decay * big_d + (1 - hmm_decay) * d0_matrix + xi
            new_transition = big_d / big_d.sum(axis=0, keepdims=True)
            new_prior = new_transition @ post
            new_prev = post
        else:
            big_d = hmm_decay * big_d + (1 - hmm_decay) * d0_matrix
            new_transition = big_d / big_d.sum(axis=0, keepdims=True)
            new_prior = new_transition @ belief
            new_prev = belief
        new_prior = new_prior / new_prior.sum()
        d[p] = big_d.reshape(9)
        prior[p] = new_prior
        prev[p] = new_prev
        step_state[p] = 0
        predicted[int(np.argmax(prior[p]))] += 1
    return (observed, partial, correct, *predicted)


def dps_scores(prior, ids, entropy_weight: float):
    """prior(2) + w_H * H(prior), entropy in nats (scipy.special.entr(x) = -x ln x)."""
    rows = prior[ids].astype(np.float64)
    return rows[:, 1] + entropy_weight * entr(rows).sum(axis=1)


def large_n_limit(n, k: int):
    """docs/methods.md §1.1: I_K -> 0.5 ln(1 + K/n) for large n."""
    return 0.5 * np.log1p(k / np.asarray(n, dtype=np.float64))


def log_comb(k: int, s: int) -> float:
    return math.log(math.comb(k, s))


# ---------------------------------------------------------------- cold start (docs/methods.md §6)


def group_rate(alpha0: float, beta0: float, s_g: float, t_g: float) -> float:
    """m_g = (alpha0 + S_g) / (alpha0 + beta0 + T_g)."""
    return (alpha0 + s_g) / (alpha0 + beta0 + t_g)


def live_p0(pass_rate, group, sums, trials, p: int, alpha0: float, beta0: float) -> float:
    """p0_i: the pass rate if known, else the group's rate if it has a group, else NaN."""
    rate = float(pass_rate[p])
    if not math.isnan(rate):
        return rate
    g = int(group[p])
    if g >= 0:
        return group_rate(alpha0, beta0, float(sums[g]), float(trials[g]))
    return math.nan


def live_strength(pass_rate, pass_samples, p, prior_strength):
    """s_i of docs/methods.md §6: a known pass rate's own sample count when it has one, else the dataset's
    prior_strength."""
    if pass_samples is not None and not math.isnan(float(pass_rate[p])) and int(pass_samples[p]) >= 1:
        return float(pass_samples[p])
    return prior_strength


def cold_beta(n_obs, alpha, beta, prior_p0, pass_rate, group, sums, trials, ids, alpha0, beta0, prior_strength,
              pass_samples=None):  # fmt: skip
    """The Beta every score uses, prompt by prompt: the posterior once observed, else the cold prior
    Beta(alpha0 + s_i p0, beta0 + s_i (1 - p0)) (Beta(alpha0, beta0) without p0), s_i the rate's sample count or the
    dataset's prior_strength. Returns (alpha, beta, p0) lists."""
    out_a, out_b, out_p0 = [], [], []
    for p in ids:
        if n_obs[p] > 0:
            out_a.append(float(alpha[p]))
            out_b.append(float(beta[p]))
            out_p0.append(float(prior_p0[p]))
            continue
        p0 = live_p0(pass_rate, group, sums, trials, p, alpha0, beta0)
        out_p0.append(p0)
        s = live_strength(pass_rate, pass_samples, p, prior_strength)
        if math.isnan(p0):
            out_a.append(alpha0)
            out_b.append(beta0)
        else:
            out_a.append(alpha0 + s * p0)
            out_b.append(beta0 + s * (1 - p0))
    return np.array(out_a), np.array(out_b), np.array(out_p0)


def profile_beta(pass_rate, pass_samples, ids, alpha0, beta0, prior_strength):
    """The Beta of the uploaded profile alone (docs/methods.md §9, reprofile false), prompt by prompt."""
    out_a, out_b = [], []
    for p in ids:
        r = float(pass_rate[p])
        if math.isnan(r):
            out_a.append(alpha0)
            out_b.append(beta0)
            continue
        s = live_strength(pass_rate, pass_samples, p, prior_strength)
        out_a.append(alpha0 + s * r)
        out_b.append(beta0 + s * (1 - r))
    return np.array(out_a), np.array(out_b)


def all_of_group(a: float, b: float, k: int) -> float:
    """E[p^k] under Beta(a, b) from the Beta function, B(a + k, b) / B(a, b), in mpmath at 40 + 2
    log10(a + b) digits (the textbook form cancels: ln B is ~1e302 at the top of the domain): the
    probability that k rollouts all succeed (docs/methods.md §9). Swap a and b for all failing."""
    import mpmath

    with mpmath.workdps(40 + 2 * int(math.log10(a + b) + 1)):
        a_, b_ = mpmath.mpf(a), mpmath.mpf(b)
        return float(mpmath.exp(mpmath.log(mpmath.beta(a_ + k, b_)) - mpmath.log(mpmath.beta(a_, b_))))


def filter_codes(alpha, beta, k, solved, unsolved):
    """0 keep, 1 dropped as solved, 2 dropped as unsolved (docs/methods.md §9), prompt by prompt."""
    out = []
    for a, b in zip(alpha, beta, strict=True):
        if all_of_group(a, b, k) >= solved:
            out.append(1)
        elif all_of_group(b, a, k) >= unsolved:
            out.append(2)
        else:
            out.append(0)
    return np.array(out, dtype=np.int8)


def mean_abs_advantage(successes: float, trials: float) -> float:
    """SEC's |advantage| of a group, from its literal binary rewards (S ones, K - S zeros)."""
    k = int(trials)
    if k < 2:
        return 0.0
    rewards = np.array([1.0] * int(successes) + [0.0] * (k - int(successes)))
    return float(np.mean(np.abs(rewards - rewards.mean())) / (np.std(rewards, ddof=1) + 1e-6))


def apply_results_cold(
    arr: dict, sh: dict, ids, successes, trials, states, beta_decay, alpha0, beta0, prior_strength
):
    """docs/methods.md §1 + 6 + the step statistics of docs/methods.md §7, one result after another (in place).

    arr: per-prompt arrays (alpha, beta, step_state, last_state, n_obs, pass_rate, group, prior_p0,
    streak, and optionally pass_samples with prior_n); sh: group_successes, group_trials, step_adv,
    step_adv_n, step_counts."""
    samples = arr.get("pass_samples")
    for p, s, t, st in zip(ids, successes, trials, states, strict=True):
        s, t, st = float(s), float(t), int(st)
        g = int(arr["group"][p])
        if arr["n_obs"][p] == 0:
            p0 = live_p0(
                arr["pass_rate"], arr["group"], sh["group_successes"], sh["group_trials"], p, alpha0, beta0
            )
            arr["prior_p0"][p] = p0
            if samples is not None:  # a count freezes only beside the pass rate it weighs
                known = not math.isnan(float(arr["pass_rate"][p])) and int(samples[p]) >= 1
                arr["prior_n"][p] = int(samples[p]) if known else -1
        p0 = float(arr["prior_p0"][p])
        weight = prior_strength if samples is None or arr["prior_n"][p] < 1 else float(arr["prior_n"][p])
        a_i = alpha0 if math.isnan(p0) else alpha0 + weight * p0
        b_i = beta0 if math.isnan(p0) else beta0 + weight * (1 - p0)
        if arr["n_obs"][p] == 0:
            arr["alpha"][p] = a_i
            arr["beta"][p] = b_i
        arr["alpha"][p] = beta_decay * arr["alpha"][p] + (1 - beta_decay) * a_i + s
        arr["beta"][p] = beta_decay * arr["beta"][p] + (1 - beta_decay) * b_i + (t - s)
        arr["step_state"][p] = combine_state(int(arr["step_state"][p]), st)
        arr["last_state"][p] = st
        arr["n_obs"][p] = min(int(arr["n_obs"][p]) + 1, 2**31 - 1)
        z = int(arr["streak"][p])
        if st == 3:
            arr["streak"][p] = min(max(z, 0) + 1, 32767)
        elif st == 1:
            arr["streak"][p] = max(min(z, 0) - 1, -32767)
        else:
            arr["streak"][p] = 0
        if g >= 0:
            sh["group_successes"][g] += s
            sh["group_trials"][g] += t
            sh["step_adv"][g] += mean_abs_advantage(s, t)
            sh["step_adv_n"][g] += 1
        counts = sh["step_counts"]
        counts[0] += 1
        counts[1] += st == 3
        counts[2] += st == 1
        counts[3] += s
        counts[4] += t


# ---------------------------------------------------------------- strategies from the field (docs/methods.md §7)


def learnability(a, b):
    """E[phi (1 - phi)] under Beta(a, b) from its definition, B(a + 1, b + 1) / B(a, b), at 40 digits
    (mpmath; in float64 the two log-Beta terms cancel to ~1e-9 for a, b ~ 1e6)."""
    import mpmath

    with mpmath.workdps(40):
        values = [
            float(
                mpmath.beta(mpmath.mpf(x) + 1, mpmath.mpf(y) + 1) / mpmath.beta(mpmath.mpf(x), mpmath.mpf(y))
            )
            for x, y in zip(np.ravel(a), np.ravel(b), strict=True)
        ]
    return np.array(values).reshape(np.shape(a))


def close_shared(sh: dict, rules: dict) -> None:
    """The step close of the shared state (step_close.close_shared), written out (in place)."""
    results, easy, hard, succ, trials = (float(x) for x in sh["step_counts"])
    if results > 0:
        for name, share, target in (
            ("p_easy", easy / results, 0.25 / 3),
            ("p_hard", hard / results, 0.25 * 2 / 3),
        ):
            p = sh[name] - 0.01 if share >= target else sh[name] + 0.01
            sh[name] = min(max(p, 0.05), 0.95)
    if trials > 0:
        r = succ / trials
        t = sh["adarft_t"] + rules["adarft_eta"] * math.tanh(
            rules["adarft_alpha"] * (r - rules["adarft_beta"])
        )
        sh["adarft_t"] = min(max(t, 0.0), 100.0)
    for g in range(len(sh["sec_q"])):
        r_g = sh["step_adv"][g] / sh["step_adv_n"][g] if sh["step_adv_n"][g] > 0 else 0.0
        sh["sec_q"][g] = (1 - rules["sec_lr"]) * sh["sec_q"][g] + rules["sec_lr"] * r_g
        sh["group_successes"][g] *= rules["group_decay"]
        sh["group_trials"][g] *= rules["group_decay"]
        sh["step_adv"][g] = 0.0
        sh["step_adv_n"][g] = 0
    sh["step_counts"][:] = 0.0


def greso_keep(streak: int, p_easy: float, p_hard: float) -> float:
    """Probability that GRESO keeps a prompt with this trailing run (docs/methods.md §7)."""
    if streak > 0:
        return max(p_easy**streak, 0.01)
    if streak < 0:
        return max(p_hard ** (-streak), 0.01)
    return 1.0


# ---------------------------------------------------------------- the counter-based generator (core/rng.py)
# Pure-Python integers and the math module: no numpy, no numba. The fast kernels must agree bit for bit.

U64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
CHILD_SALT = 0x5851F42D4C957F2D


def rng_stream_id(key: str, step: int, seed: int, purpose: str) -> int:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for part in (key, purpose):
        raw = part.encode("utf-8")
        h.update(len(raw).to_bytes(8, "little") + raw)
    h.update(step.to_bytes(8, "little") + (seed % 2**64).to_bytes(8, "little"))
    return int.from_bytes(h.digest()[:8], "little")


def rng_bits(s: int, i: int) -> int:
    """SplitMix64 output i of the sequence seeded with s."""
    z = (s + (i + 1) * GOLDEN) & U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
    return z ^ (z >> 31)


def rng_child(s: int, j: int) -> int:
    return rng_bits(s ^ CHILD_SALT, j)


def rng_uniform(s: int, i: int) -> float:
    return (rng_bits(s, i) >> 11) * 2.0**-53


def rng_uniform_open(s: int, i: int) -> float:
    return (rng_bits(s, i) >> 11) * 2.0**-53 + 2.0**-54


def rng_bounded(s: int, i: int, m: int) -> int:
    """Uniform in [0, m): x * m >> 64, redrawing from child(s, i) while the low word is < 2^64 mod m."""
    threshold = (1 << 64) % m
    x, attempt = rng_bits(s, i), 0
    while (x * m) & U64 < threshold:
        x = rng_bits(rng_child(s, i), attempt)
        attempt += 1
    return (x * m) >> 64


def rng_sample(s: int, n: int, k: int) -> list[int]:
    if 4 * k < n:  # Floyd, then Fisher-Yates over the ids in the order taken
        taken: set[int] = set()
        out = []
        for j in range(n - k, n):
            t = rng_bounded(rng_child(s, 0), j, j + 1)
            t = j if t in taken else t
            taken.add(t)
            out.append(t)
        for i in range(k - 1, 0, -1):
            j = rng_bounded(rng_child(s, 1), i, i + 1)
            out[i], out[j] = out[j], out[i]
        return out
    ids = list(range(n))
    for i in range(k):
        j = i + rng_bounded(rng_child(s, 2), i, n - i)
        ids[i], ids[j] = ids[j], ids[i]
    return ids[:k]


def rng_permutation(s: int, n: int) -> list[int]:
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng_bounded(s, i, i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def _log1p_minus_x(y: float) -> float:
    if abs(y) >= 1 / 64:
        return math.log1p(y) - y
    coef = [-0.5, 1 / 3, -0.25, 0.2, -1 / 6, 1 / 7, -0.125, 1 / 9, -0.1]
    poly = coef[-1]
    for c in reversed(coef[:-1]):
        poly = c + y * poly
    return y * y * poly


def rng_log_gamma(s: int, c: int, a: float) -> tuple[float, int]:
    """Marsaglia-Tsang in log space; outputs c, c+1, ... of stream s. Returns (ln X, next output)."""
    shape = a + 1.0 if a < 1.0 else a
    d = shape - 1.0 / 3.0
    cc = 1.0 / math.sqrt(9.0 * d)
    while True:
        while True:
            u1 = 2.0 * rng_uniform(s, c) - 1.0
            u2 = 2.0 * rng_uniform(s, c + 1) - 1.0
            c += 2
            q = u1 * u1 + u2 * u2
            if 0.0 < q < 1.0:
                break
        x = u1 * math.sqrt(-2.0 * math.log(q) / q)
        y = cc * x
        if y <= -1.0:
            continue
        u = rng_uniform_open(s, c)
        c += 1
        x2 = x * x
        if u < 1.0 - 0.0331 * (x2 * x2):
            break
        if math.log(u) < 0.5 * x2 + d * (3.0 * _log1p_minus_x(y) - y * y * (3.0 + y)):
            break
    log_x = math.log(d) + 3.0 * math.log1p(y)
    if a < 1.0:
        log_x += math.log(rng_uniform_open(s, c)) / a
        c += 1
    return log_x, c


def rng_beta(s: int, a: float, b: float, item: int) -> float:
    sub = rng_child(s, item)
    log_x, c = rng_log_gamma(sub, 0, a)
    log_y, _ = rng_log_gamma(sub, c, b)
    try:
        ratio = math.exp(log_y - log_x)
    except OverflowError:  # C's exp gives inf here, and so does the kernel
        ratio = math.inf
    return 1.0 / (1.0 + ratio)


def topk_random_ties(scores, k: int, s: int) -> list[int]:
    """The tie rule of select.topk_random_ties, literally: the k largest scores; the tied ones at the
    boundary chosen by rng_sample(child(s, 0), #tied, need) over the tied positions in ascending order;
    then descending score, equal scores by the key rng_bits(child(s, 1), position)."""
    scores = [float(x) for x in scores]
    if k == 0:
        return []
    boundary = sorted(scores, reverse=True)[k - 1]
    above = [p for p, x in enumerate(scores) if x > boundary]
    tied = [p for p, x in enumerate(scores) if x == boundary]
    need = k - len(above)
    if need < len(tied):
        tied = [tied[i] for i in rng_sample(rng_child(s, 0), len(tied), need)]
    chosen = above + tied
    return sorted(chosen, key=lambda p: (-scores[p], rng_bits(rng_child(s, 1), p), p))


# ---------------------------------------------------------------- rollout allocation (docs/methods.md §8)


def _value_digits(a: float, b: float) -> int:
    return 60 + 2 * int(math.log10(float(a) + float(b) + 1.0))


def rollout_value(a: float, b: float, n: int, policy: str, value: str = "mixed"):
    """V(n) of one prompt with belief Beta(a, b), from its definition (an mpf): the Beta moments
    E[p^i q^j] = B(a + i, b + j) / B(a, b) for `posterior`, the point p = a / (a + b) for `knapsack` and
    `variance` (VIP's p clipped to [1e-6, 1 - 1e-6], gamma 7e-4); 0 for `uniform`. At 60 + 2 log10(a + b)
    digits: ln B(a, b) is ~(a + b) ln(a + b) and V(n + 1) - V(n) may be ~1 / (a + b) of V's terms."""
    import mpmath

    with mpmath.workdps(_value_digits(a, b)):
        a, b = mpmath.mpf(a), mpmath.mpf(b)
        if policy == "uniform":
            return mpmath.mpf(0)
        if policy == "posterior":

            def moment(i, j):
                return mpmath.exp(mpmath.log(mpmath.beta(a + i, b + j)) - mpmath.log(mpmath.beta(a, b)))

            if value == "mixed":
                return 1 - moment(n, 0) - moment(0, n)
            return moment(1, 2) - moment(n + 1, 2) - moment(1, n + 2)  # E[(1 - p^n - q^n) p q^2]
        p = a / (a + b)
        q = b / (a + b)
        if policy == "knapsack":
            return (1 - p**n - q**n) * p * q * q
        p = min(max(p, mpmath.mpf("1e-6")), 1 - mpmath.mpf("1e-6"))
        if n == 1:
            return -mpmath.inf
        return -(p * (1 - p) / (n - 1) + mpmath.mpf("7e-4") * n * mpmath.log(p))


def rollout_gains(alpha, beta, lo: int, levels: int, policy: str, value: str = "mixed") -> np.ndarray:
    """g_i(lo + j) = V_i(lo + j + 1) - V_i(lo + j), literally (float64[B, levels], no running minimum)."""
    import mpmath

    out = np.zeros((len(alpha), levels))
    for i, (a, b) in enumerate(zip(alpha, beta, strict=True)):
        with mpmath.workdps(_value_digits(a, b)):
            values = [rollout_value(a, b, lo + j, policy, value) for j in range(levels + 1)]
            for j in range(levels):
                if values[j] == -mpmath.inf:
                    out[i, j] = math.inf
                else:
                    out[i, j] = float(values[j + 1] - values[j])
    return out


def allocate_greedy(gains, budget: int, lo: int, tie_keys, ids) -> list[int]:
    """Marginal allocation one rollout at a time: each of the R = budget - B lo rollouts goes to the
    prompt whose next gain is largest; equal gains to the prompt with the fewest rollouts, then the
    larger tie key, then the lower id, then the lower position."""
    batch, width = len(gains), len(gains[0]) if len(gains) else 0
    taken = [0] * batch
    for _ in range(budget - batch * lo):
        best = None
        for i in range(batch):
            if taken[i] == width:
                continue
            rank = (float(gains[i][taken[i]]), -taken[i], int(tie_keys[i]), -int(ids[i]), -i)
            if best is None or rank > best[0]:
                best = (rank, i)
        taken[best[1]] += 1
    return [lo + k for k in taken]


def allocate_dp(gains, budget: int, lo: int) -> float:
    """The largest sum of gains any counts in [lo, lo + width] summing to `budget` can take: a dynamic
    program over prompts and rollouts spent (Knapsack RL's, for a table of values), float64."""
    batch = len(gains)
    width = len(gains[0]) if batch else 0
    spare = budget - batch * lo
    best = np.full(spare + 1, -np.inf)
    best[0] = 0.0
    for i in range(batch):
        prefix = np.concatenate([[0.0], np.cumsum(gains[i])])
        nxt = np.full(spare + 1, -np.inf)
        for used in range(spare + 1):
            if best[used] == -np.inf:
                continue
            for k in range(min(width, spare - used) + 1):
                nxt[used + k] = max(nxt[used + k], best[used] + prefix[k])
        best = nxt
    return float(best[spare])


# ---------------------------------------------------------------- JSON arrays (selector_service/contract/jsonscan.py)


def array_separators(text: bytes) -> list[int]:
    """Byte positions of a JSON array's top-level commas, then of its closing bracket, found by decoding
    the array element by element with the standard library (latin-1 keeps one character per byte; the
    JSON structure is the same)."""
    import json

    s = text.decode("latin-1")
    decoder = json.JSONDecoder()

    def skip(i: int) -> int:
        while i < len(s) and s[i] in " \t\r\n":
            i += 1
        return i

    i = skip(0)
    assert s[i] == "["
    i = skip(i + 1)
    if s[i] == "]":
        return [i]
    seps = []
    while True:
        _, end = decoder.raw_decode(s, i)
        i = skip(end)
        seps.append(i)
        if s[i] == "]":
            return seps
        i = skip(i + 1)
