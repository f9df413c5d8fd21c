"""BeliefArrays and the Beta update (core/beliefs.py, docs/methods.md §1)."""

from __future__ import annotations

import numpy as np
import pytest

from selector_service.core import PARTIAL, SOLVED, UNSOLVED, BeliefArrays, apply_results, close_step
from tests.core import naive


def random_results(rng, n, m, fractional=False):
    ids = rng.integers(0, n, m)  # repeats on purpose: order matters when lam < 1
    trials = rng.choice([1.0, 4.0, 8.0], m)
    if fractional:
        successes = np.round(rng.uniform(0, 1, m) * trials, 3)
    else:
        successes = np.floor(rng.uniform(0, 1, m) * (trials + 1))
    successes = np.minimum(successes, trials)
    states = np.where(successes == 0, UNSOLVED, np.where(successes == trials, SOLVED, PARTIAL)).astype(
        np.int8
    )
    return ids, successes, trials, states


def test_new_has_the_methods_priors_and_fits_the_memory_budget():
    ba = BeliefArrays.new(5, 2.0, 3.0)
    assert ba.n == 5 and ba.observed == 0
    assert np.all(ba.alpha == 2.0) and np.all(ba.beta == 3.0)
    dense = ba.dense_hmm()
    assert np.all(dense["hmm_d"] == 1.0) and dense["hmm_d"].shape == (5, 9)
    assert np.all(dense["hmm_prior"] == np.float32(1 / 3)) and np.all(dense["hmm_prev"] == np.float32(1 / 3))
    assert not dense["step_state"].any() and not ba.last_state.any() and not ba.n_obs.any()
    assert np.all(ba.hmm_slot == -1)
    assert np.isnan(ba.pass_rate).all() and (ba.group == -1).all() and np.isnan(ba.prior_p0).all()
    assert not ba.streak.any() and ba.shared.n_groups == 0
    assert (ba.pass_samples == -1).all() and not ba.profiled.any() and (ba.prior_n == -1).all()
    # 52 bytes per prompt (25 + 27 of metadata) + 65 per observed prompt: 117 when all are observed,
    # within the 128 budget
    assert ba.nbytes_per_prompt == 117 <= 128
    assert BeliefArrays.bytes_per_prompt(0.0) == 52 and BeliefArrays.bytes_per_prompt(0.01) == 52.65
    assert sum(a.nbytes for a in ba.arrays().values()) == 52 * ba.n  # nothing observed yet


def test_the_observed_set_grows_in_order_of_first_observation():
    ba = BeliefArrays.new(5000)
    order = [7, 4999, 3, 7, 12, 3]
    for p in order:
        apply_results(
            ba, np.array([p]), np.array([1.0]), np.array([2.0]), np.array([PARTIAL], np.int8), 1.0, 1.0, 1.0
        )
    assert ba.observed == 4 and ba.obs_ids[:4].tolist() == [7, 4999, 3, 12]
    assert ba.hmm_slot[[7, 4999, 3, 12, 0]].tolist() == [0, 1, 2, 3, -1]
    ids = np.arange(5000)
    apply_results(ba, ids, np.ones(5000), np.full(5000, 2.0), np.full(5000, PARTIAL, np.int8), 1.0, 1.0, 1.0)
    assert ba.observed == 5000 and ba.capacity == 5000  # never beyond N
    assert ba.obs_ids[:6].tolist() == [7, 4999, 3, 12, 0, 1]
    np.testing.assert_array_equal(ba.hmm_slot[ba.obs_ids], np.arange(5000))


@pytest.mark.parametrize(("n", "a0", "b0"), [(0, 1.0, 1.0), (3, 0.0, 1.0), (3, 1.0, float("inf"))])
def test_new_rejects_bad_arguments(n, a0, b0):
    with pytest.raises(ValueError):
        BeliefArrays.new(n, a0, b0)


def test_arrays_round_trip_and_copy_is_deep():
    ba = BeliefArrays.new(4)
    rng = np.random.default_rng(0)
    apply_results(ba, *random_results(rng, 4, 10), 0.7, 1.0, 1.0)
    snapshot = {k: v.copy() for k, v in ba.arrays().items()}
    back = BeliefArrays.from_arrays(snapshot)
    for name, arr in ba.arrays().items():
        np.testing.assert_array_equal(back.arrays()[name], arr)
        assert back.arrays()[name].dtype == arr.dtype
    clone = ba.copy()
    clone.alpha[0] += 1.0
    clone.obs_d[0, 0] += 1.0
    assert clone.alpha[0] != ba.alpha[0] and clone.obs_d[0, 0] != ba.obs_d[0, 0]


def test_from_arrays_accepts_read_only_buffers_and_rejects_bad_shapes():
    ba = BeliefArrays.new(3)
    apply_results(ba, np.array([2]), np.array([1.0]), np.array([2.0]), np.array([2], np.int8), 1.0, 1.0, 1.0)
    frozen = {}
    for name, arr in ba.arrays().items():
        ro = np.frombuffer(arr.tobytes(), dtype=arr.dtype).reshape(arr.shape)  # as from a snapshot blob
        assert not ro.flags.writeable
        frozen[name] = ro
    back = BeliefArrays.from_arrays(frozen)
    assert back.alpha.flags.writeable and back.obs_d.flags.writeable
    bad = dict(ba.arrays(), obs_d=np.ones((1, 8), np.float32))
    with pytest.raises(ValueError, match="obs_d"):
        BeliefArrays.from_arrays(bad)
    with pytest.raises(ValueError, match="missing"):
        BeliefArrays.from_arrays({"alpha": ba.alpha})


def _corrupt(arrays, name, value):
    arrays = {k: v.copy() for k, v in arrays.items()}
    arrays[name] = np.asarray(value, dtype=arrays[name].dtype)
    return arrays


def test_from_arrays_refuses_an_observed_set_that_does_not_match_the_slot_map():
    """The kernels index by slot and prompt id without bounds checks."""
    ba = BeliefArrays.new(4)
    apply_results(ba, np.array([3, 1]), np.ones(2), np.full(2, 2.0), np.full(2, 2, np.int8), 1.0, 1.0, 1.0)
    good = ba.arrays()
    assert good["obs_ids"].tolist() == [3, 1] and good["hmm_slot"].tolist() == [-1, 1, -1, 0]
    for name, value in [
        ("hmm_slot", [-1, 0, -1, 0]),  # two prompts on one slot
        ("hmm_slot", [-1, 1, -1, 2]),  # a slot past the observed set
        ("hmm_slot", [0, 1, -1, -1]),  # slot 0 names prompt 3, not prompt 0
        ("obs_ids", [3, 7]),  # a prompt id out of range
        ("hmm_slot", [-1, 1, -2, 0]),
    ]:
        with pytest.raises(ValueError, match="observed set"):
            BeliefArrays.from_arrays(_corrupt(good, name, value))


@pytest.mark.parametrize("lam", [1.0, 0.7, 0.5, 0.0])
@pytest.mark.parametrize("fractional", [False, True])
def test_apply_results_matches_the_sequential_twin(lam, fractional):
    rng = np.random.default_rng(int(lam * 10) + fractional)
    n, a0, b0 = 40, 1.0, 2.0
    ba = BeliefArrays.new(n, a0, b0)
    ref = {k: v.copy() for k, v in ba.arrays().items()}
    ref["step_state"] = np.zeros(n, dtype=np.int8)
    for _ in range(5):
        ids, s, t, states = random_results(rng, n, 60, fractional)
        apply_results(ba, ids, s, t, states, lam, a0, b0)
        naive.apply_results(ref["alpha"], ref["beta"], ref["step_state"], ref["last_state"], ref["n_obs"],
                            ids, s, t, states, lam, a0, b0)  # fmt: skip
    # Same operations in the same order: bitwise equal.
    ours = dict(ba.arrays(), step_state=ba.dense_hmm()["step_state"])
    for name in ("alpha", "beta", "step_state", "last_state", "n_obs"):
        np.testing.assert_array_equal(ours[name], ref[name], err_msg=name)


def test_update_formula_by_hand():
    """alpha <- lam alpha + (1 - lam) alpha0 + S applied one result after another (docs/methods.md §1)."""
    ba = BeliefArrays.new(2, 1.0, 1.0)
    ids = np.array([1, 1])
    apply_results(
        ba, ids, np.array([3.0, 0.0]), np.array([8.0, 8.0]), np.array([PARTIAL, UNSOLVED]), 0.5, 1.0, 1.0
    )
    # first: alpha = 0.5 + 0.5 + 3 = 4, beta = 0.5 + 0.5 + 5 = 6; second: alpha = 2 + 0.5 = 2.5, beta = 3.5 + 8
    assert ba.alpha.tolist() == [1.0, 2.5] and ba.beta.tolist() == [1.0, 11.5]
    assert ba.dense_hmm()["step_state"].tolist() == [0, PARTIAL] and ba.last_state.tolist() == [0, UNSOLVED]
    assert ba.n_obs.tolist() == [0, 2]


@pytest.mark.parametrize(
    ("ids", "s", "t", "states", "message"),
    [
        ([0, 5], [1.0, 1.0], [2.0, 2.0], [2, 2], r"\[0, 3\)"),
        ([0], [3.0], [2.0], [2], "successes"),
        ([0], [-1.0], [2.0], [2], "successes"),
        ([0], [0.0], [0.0], [1], "trials > 0"),
        ([0], [np.nan], [2.0], [2], "finite"),
        ([0], [1.0], [2.0], [0], "states"),
        ([0, 1], [1.0], [2.0], [2], "one length"),
    ],
)
def test_apply_results_validates_and_changes_nothing_on_error(ids, s, t, states, message):
    ba = BeliefArrays.new(3)
    before = ba.copy()
    with pytest.raises(ValueError, match=message):
        apply_results(ba, np.array(ids), np.array(s), np.array(t), np.array(states, np.int8), 1.0, 1.0, 1.0)
    after = ba.arrays()
    for name, arr in before.arrays().items():
        np.testing.assert_array_equal(after[name], arr, err_msg=name)


def test_apply_results_rejects_a_bad_decay():
    ba = BeliefArrays.new(3)
    with pytest.raises(ValueError, match="beta_decay"):
        apply_results(
            ba, np.array([0]), np.array([1.0]), np.array([2.0]), np.array([2], np.int8), 1.5, 1.0, 1.0
        )


def test_a_dataset_that_fixes_its_decays_is_applied_by_them_alone():
    """The decays reach the kernels one way: a dataset's rules that fix them (as a spec's do) are what
    apply_results and close_step use, bit for bit what a call naming them gives beliefs that leave them
    open; a call may repeat the dataset's decay but not name another, and open decays must be named."""
    rng = np.random.default_rng(11)
    fixed = BeliefArrays.new(40, 0.5, 1.5, beta_decay=0.8, hmm_decay=0.6)
    named = BeliefArrays.new(40, 0.5, 1.5)
    for _ in range(3):
        results = random_results(rng, 40, 30)
        apply_results(fixed, *results)
        apply_results(named, *results, 0.8, 0.5, 1.5)
        assert close_step(fixed) == close_step(named, 0.6)
    results = random_results(rng, 40, 5)
    apply_results(fixed, *results, 0.8)  # the dataset's own decay, repeated
    apply_results(named, *results, 0.8)
    for name, arr in named.arrays().items():
        np.testing.assert_array_equal(fixed.arrays()[name], arr, err_msg=name)
    before = fixed.copy()
    with pytest.raises(ValueError, match=r"beta_decay 0\.5 differs from the dataset's 0\.8"):
        apply_results(fixed, *random_results(rng, 40, 5), 0.5)
    with pytest.raises(ValueError, match=r"hmm_decay 0\.7 differs from the dataset's 0\.6"):
        close_step(fixed, 0.7)
    for name, arr in before.arrays().items():
        np.testing.assert_array_equal(fixed.arrays()[name], arr, err_msg=name)
    with pytest.raises(ValueError, match="beta_decay is not fixed"):
        apply_results(BeliefArrays.new(3), *random_results(rng, 3, 2))
    with pytest.raises(ValueError, match="hmm_decay is not fixed"):
        close_step(BeliefArrays.new(3))
    with pytest.raises(ValueError, match="hmm_decay"):
        BeliefArrays.new(3, hmm_decay=0.0)  # a dataset's decays lie in (0, 1], as its spec's


def test_canonical_arrays_do_not_depend_on_the_order_within_a_step():
    """Two beliefs fed the same results of a step in different orders (as a replica and a model that
    replays acknowledged requests sorted differently) hold the observed set in different slot orders but
    have the same canonical arrays, before and after the close."""
    rng = np.random.default_rng(11)
    first, second = BeliefArrays.new(30), BeliefArrays.new(30)
    for _ in range(3):
        ids = rng.choice(30, 12, replace=False)
        s = rng.integers(0, 9, 12).astype(float)
        states = np.where(s == 0, UNSOLVED, np.where(s == 8, SOLVED, PARTIAL)).astype(np.int8)
        order = rng.permutation(12)
        apply_results(first, ids, s, np.full(12, 8.0), states, 1.0, 1.0, 1.0)
        apply_results(second, ids[order], s[order], np.full(12, 8.0), states[order], 1.0, 1.0, 1.0)
        for _ in range(2):
            a, b = first.canonical_arrays(), second.canonical_arrays()
            for name in a:
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)
            close_step(first, 0.7)
            close_step(second, 0.7)
    assert not np.array_equal(first.obs_ids[: first.observed], second.obs_ids[: second.observed])


def test_predicted_state_counts_share_ties_equally():
    """A never-observed prompt's prior ties at 1/3: it is not counted as unsolved."""
    ba = BeliefArrays.new(9)
    np.testing.assert_allclose(ba.predicted_state_counts(), [3.0, 3.0, 3.0])
    ids = np.array([0, 1], dtype=np.int64)
    apply_results(
        ba, ids, np.array([1.0, 2.0]), np.array([2.0, 2.0]), np.array([2, 3], dtype=np.int8), 1.0, 1.0, 1.0
    )
    close_step(ba, 0.5)
    counts = ba.predicted_state_counts()
    assert counts.sum() == pytest.approx(9.0)
    np.testing.assert_allclose(counts, [7 / 3, 7 / 3 + 1, 7 / 3 + 1])  # partial -> state 2; solved -> state 3


def test_the_result_count_saturates_instead_of_wrapping():
    # A prompt at the top of n_obs's range keeps its evidence: the count stops at 2^31 - 1 rather than
    # wrapping to a negative number, which every reader takes for "never observed".
    from selector_service.core.belief_domain import check_beliefs
    from selector_service.core.beliefs import N_OBS_MAX

    ba = BeliefArrays.new(3)
    one = (np.array([0]), np.array([1.0]), np.array([2.0]), np.array([PARTIAL], np.int8))
    apply_results(ba, *one, 1.0, 1.0, 1.0)
    ba.n_obs[0] = N_OBS_MAX - 2
    ids, successes, trials, states = (np.repeat(a, 5) for a in one)
    apply_results(ba, ids, successes, trials, states, 1.0, 1.0, 1.0)
    assert int(ba.n_obs[0]) == N_OBS_MAX
    assert (ba.alpha[0], ba.beta[0]) == (1.0 + 6, 1.0 + 6)  # every result counted in the posterior
    check_beliefs(ba)  # still a valid state: it snapshots, exports and imports
    n_obs = np.array([N_OBS_MAX - 1, 0], dtype=np.int32)
    naive.apply_results(
        np.ones(2), np.ones(2), np.zeros(2, np.int8), np.zeros(2, np.int8), n_obs,
        np.array([0, 0, 0]), np.ones(3), np.full(3, 2.0), np.full(3, PARTIAL), 1.0, 1.0, 1.0,
    )  # fmt: skip
    assert n_obs.tolist() == [N_OBS_MAX, 0]
