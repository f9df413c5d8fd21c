"""GRESO's and SEC's walks and the positions the dataset advances at step close (core/walks.py, docs/methods.md §7).

The twins below walk position by position with the same random streams, drawn from the pure-Python twin
of the generator (tests/core/naive.py), so a test against them checks the fast walks' chunking, epoch and
pass boundaries, skip rule, category draws, capping and bookkeeping.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from selector_service.core import (
    PARTIAL,
    SOLVED,
    UNSOLVED,
    BeliefArrays,
    ParamError,
    apply_results,
    close_step,
    select,
)
from selector_service.core.coldstart import apply_metadata
from selector_service.core.select import epoch_permutation
from selector_service.core.step_close import close_shared
from selector_service.core.walks import (
    WalkError,
    advance_walks,
    greso_batch,
    greso_keep_probability,
    sec_batch,
    sec_policy,
)
from tests.core import naive

# ---------------------------------------------------------------- twins


def twin_greso_walk(n, key, pos, streak, p_easy, p_hard):
    """Yields (position, id, survives) along GRESO's walk, one position at a time, over two epochs."""
    perms = {}
    for q in range(pos, pos + 2 * n):
        epoch, offset = divmod(q, n)
        if epoch not in perms:
            perms[epoch] = naive.rng_permutation(naive.rng_stream_id(key, epoch, 0, "uniform-epoch"), n)
        pid = perms[epoch][offset]
        keep = naive.greso_keep(int(streak[pid]), p_easy, p_hard)
        u = naive.rng_uniform(naive.rng_stream_id(key, epoch, 0, "greso-skip"), offset)
        yield q, pid, u < keep


def twin_greso_batch(ba, batch, key):
    sh = ba.shared
    out, skipped = [], []
    for _, pid, survives in twin_greso_walk(ba.n, key, sh.greso_pos, ba.streak, sh.p_easy, sh.p_hard):
        if survives and pid not in out:
            out.append(pid)
            if len(out) == batch:
                return out
        elif not survives:
            skipped.append(pid)
    for pid in skipped:  # fewer survivors than the batch in two epochs: skipped prompts, in walk order
        if pid not in out:
            out.append(pid)
        if len(out) == batch:
            break
    return out


def twin_greso_position(ba, key, observed):
    """Where the walk stands after a step at which `observed` prompts were observed."""
    sh = ba.shared
    for q, pid, survives in twin_greso_walk(ba.n, key, sh.greso_pos, ba.streak, sh.p_easy, sh.p_hard):
        if not observed[pid] and survives:
            return q
    return sh.greso_pos + 2 * ba.n


def twin_category_order(members, g, key, passes):
    """Category g's pass orders, concatenated."""
    return [
        int(x)
        for p in range(passes)
        for x in members[naive.rng_permutation(naive.rng_stream_id(key, p, 0, f"sec-walk-{g}"), members.size)]
    ]


def groups_of(ba):
    return {g: np.flatnonzero(ba.group == g) for g in range(ba.shared.n_groups) if (ba.group == g).any()}


def observe(ba, ids, successes, k=8):
    successes = np.asarray(successes, dtype=float)
    states = np.where(successes == 0, UNSOLVED, np.where(successes == k, SOLVED, PARTIAL)).astype(np.int8)
    apply_results(ba, np.asarray(ids), successes, np.full(len(ids), float(k)), states, 1.0, 1.0, 1.0)


def close(ba, key):
    advance_walks(ba, key)
    close_shared(ba)
    close_step(ba, 0.7)


# ---------------------------------------------------------------- GRESO


def test_keep_probability_matches_the_rule():
    rng = np.random.default_rng(0)
    streak = rng.integers(-40, 41, 500).astype(np.int16)
    for p_easy, p_hard in [(0.5, 0.5), (0.05, 0.95), (0.9, 0.2)]:
        got = greso_keep_probability(streak, p_easy, p_hard)
        np.testing.assert_allclose(
            got, [naive.greso_keep(int(z), p_easy, p_hard) for z in streak], rtol=1e-15
        )
    assert greso_keep_probability(np.array([0, 1, -1, 30]), 0.5, 0.25).tolist() == [1.0, 0.5, 0.25, 0.01]


@pytest.mark.parametrize(
    ("n", "batch", "pos", "p_easy", "p_hard"),
    [
        (500, 32, 0, 0.5, 0.5),
        (500, 32, 490, 0.3, 0.6),  # across an epoch boundary
        (9000, 200, 8950, 0.5, 0.5),  # several chunks, then the boundary
        (300, 250, 10, 0.05, 0.05),  # heavy skipping: the batch is completed with skipped prompts
    ],
)
def test_greso_batch_matches_the_twin(n, batch, pos, p_easy, p_hard):
    rng = np.random.default_rng(n + pos)
    ba = BeliefArrays.new(n)
    ba.streak[:] = rng.choice([-3, -1, 0, 0, 0, 1, 2, 5], n)
    ba.shared.greso_pos, ba.shared.p_easy, ba.shared.p_hard = pos, p_easy, p_hard
    got = greso_batch(ba, batch, "greso-key")
    assert got.tolist() == twin_greso_batch(ba, batch, "greso-key")
    assert np.unique(got).size == batch


def test_greso_never_skips_prompts_without_a_run_and_walks_on_when_the_batch_was_observed():
    n, batch, key = 200, 20, "walk"
    ba = BeliefArrays.new(n)
    seen = []
    for step in range(n // batch):
        ids, _ = select(
            ba, strategy="greso", params={}, batch_size=batch, step=step, seed=0, key=key, dataset_k=8
        )
        seen.extend(ids.tolist())
        observe(ba, ids, np.full(batch, 4.0))  # all partially solved: nothing gets a run
        close(ba, key)
    # Without runs GRESO is the seed-0 uniform walk: one epoch covers every prompt exactly once.
    assert sorted(seen) == list(range(n))
    assert seen == epoch_permutation(n, key, 0, 0).tolist()
    assert ba.shared.greso_pos == n


def test_greso_position_follows_what_was_observed():
    rng = np.random.default_rng(1)
    n, batch, key = 400, 25, "pos"
    ba = BeliefArrays.new(n)
    ba.streak[:] = rng.choice([-2, 0, 0, 3], n)
    ba.shared.greso_pos = 37
    ids = greso_batch(ba, batch, key)
    # Half the batch observed: the walk stops at the first survivor that was not observed.
    half = ids[::2]
    observe(ba, half, np.full(half.size, 4.0))
    observed = np.zeros(n, bool)
    observed[half] = True
    expected = twin_greso_position(ba, key, observed)
    advance_walks(ba, key)
    assert ba.shared.greso_pos == expected
    nxt = greso_batch(ba, batch, key)
    assert nxt[0] == ids[1]  # the first survivor not observed is offered again first
    # A step without results moves nothing; the whole batch observed moves past it and its skips.
    close_shared(ba)
    close_step(ba, 0.7)
    before = ba.shared.greso_pos
    advance_walks(ba, key)
    assert ba.shared.greso_pos == before
    ids = greso_batch(ba, batch, key)
    observe(ba, ids, np.full(batch, 4.0))
    observed = ba.observed_at_step(np.arange(n))
    expected = twin_greso_position(ba, key, observed)
    advance_walks(ba, key)
    assert ba.shared.greso_pos == expected
    assert not set(greso_batch(ba, batch, key)) & set(ids.tolist())


def test_greso_adapts_p_toward_the_target_shares():
    ba = BeliefArrays.new(100)
    observe(ba, np.arange(40), [8.0] * 20 + [0.0] * 20)  # easy share 0.5, hard share 0.5: both above target
    close(ba, "p")
    assert (ba.shared.p_easy, ba.shared.p_hard) == pytest.approx((0.49, 0.49))
    observe(ba, np.arange(40, 100), [4.0] * 60)  # no easy or hard groups: below target
    close(ba, "p")
    assert (ba.shared.p_easy, ba.shared.p_hard) == pytest.approx((0.50, 0.50))
    close(ba, "p")  # a step without results changes nothing
    assert (ba.shared.p_easy, ba.shared.p_hard) == pytest.approx((0.50, 0.50))
    for _ in range(100):
        observe(ba, np.arange(10), [8.0] * 10)
        close(ba, "p")
    assert ba.shared.p_easy == pytest.approx(0.05) and ba.shared.p_hard == pytest.approx(0.95)
    # Solved 101 times in a row: kept with max(0.05^101, 0.01) = 0.01.
    assert ba.streak[0] == 101
    assert greso_keep_probability(ba.streak[:1], ba.shared.p_easy, ba.shared.p_hard)[0] == 0.01


# ---------------------------------------------------------------- SEC


def sec_dataset(n=300, groups=(0, 1, 2, 5), seed=0):
    rng = np.random.default_rng(seed)
    ba = BeliefArrays.new(n, sec_lr=0.5)
    group = rng.choice(np.array((*groups, -1), dtype=np.int32), n)
    apply_metadata(ba, 0, None, group)
    return ba


def test_sec_needs_groups_and_enough_grouped_prompts():
    ba = BeliefArrays.new(50)
    with pytest.raises(ParamError, match="upload groups"):
        select(ba, strategy="sec", params={}, batch_size=4, step=0, seed=0, key="s", dataset_k=8)
    apply_metadata(ba, 0, None, np.array([0, 1, 1], np.int32))
    with pytest.raises(WalkError, match="3 prompts that have a group"):
        sec_batch(ba, 4, 0, 0, "s", 1.0)
    assert sorted(sec_batch(ba, 3, 0, 0, "s", 1.0).tolist()) == [0, 1, 2]


def test_sec_batch_matches_the_twin():
    ba = sec_dataset()
    ba.shared.sec_q[:] = [0.2, 0.9, 0.0, 0.0, 0.0, 0.4]
    ba.shared.sec_pos[:] = [3, 70, 0, 0, 0, 10]
    members = groups_of(ba)
    for step, seed, tau in [(0, 0, 1.0), (3, 7, 0.4), (9, 1, 5.0)]:
        got = sec_batch(ba, 40, step, seed, "sec", tau)
        # Twin: the same category draws, then one prompt per draw from each category's walk, in order.
        pi = sec_policy(ba, tau)
        live = ba.shared.group_size > 0
        logits = ba.shared.sec_q / tau
        expected_pi = np.where(live, np.exp(logits - logits[live].max()), 0.0)
        np.testing.assert_allclose(pi, expected_pi / expected_pi.sum(), rtol=1e-14)
        sid = naive.rng_child(naive.rng_stream_id("sec", step, seed, "sec-categories"), 0)
        cdf = np.cumsum(pi)
        draws = [
            int(np.searchsorted(cdf, naive.rng_uniform(sid, i) * cdf[-1], side="right")) for i in range(40)
        ]
        assert all(ba.shared.group_size[g] >= np.sum(draws == g) for g in draws)  # no capping here
        taken = {g: 0 for g in members}
        expected = []
        for g in draws:
            size = members[g].size
            order = twin_category_order(members[g], g, "sec", 3)
            pos = int(ba.shared.sec_pos[g])
            window = []
            for pid in order[pos : (pos // size + 2) * size]:  # to the end of the next pass, once each
                if pid not in window:
                    window.append(pid)
            expected.append(window[taken[g]])
            taken[g] += 1
        assert got.tolist() == expected
        assert np.unique(got).size == 40


def twin_sec_policy(q, group_size, tau):
    """softmax(Q / tau) over the live groups in plain Python floats, one group at a time: the max is
    subtracted before dividing (math.exp((q - top) / tau)), the definition the kernel must meet."""
    live = [g for g in range(len(q)) if group_size[g] > 0]
    top = max(float(q[g]) for g in live)
    weights = [math.exp((float(q[g]) - top) / tau) if group_size[g] > 0 else 0.0 for g in range(len(q))]
    total = math.fsum(weights)
    return [w / total for w in weights]


SEC_TAUS = (5e-324, 1e-320, 1e-310, 1e-300, 1e-3, 1.0, 1e6)
SEC_QS = {
    "distinct": [0.2, 0.9, 0.0, 0.0, 0.0, 0.4],
    "tie at the top": [0.9, 0.9, 0.0, 0.0, 0.0, 0.4],
    "all equal": [0.3] * 6,
    "all zero": [0.0] * 6,
    "one apart by the least": [0.5, np.nextafter(0.5, 1.0), 0.0, 0.0, 0.0, 0.5],
    "empty group holds the max": [0.2, 0.1, 0.0, 7.0, 0.0, 0.3],  # group 3 has no prompt
}


@pytest.mark.parametrize("tau", SEC_TAUS)
@pytest.mark.parametrize("qs", list(SEC_QS))
def test_sec_policy_matches_the_twin_over_the_whole_tau_domain(qs, tau):
    ba = sec_dataset()
    assert ba.shared.group_size[3] == 0 and (ba.shared.group_size[[0, 1, 2, 5]] > 0).all()
    ba.shared.sec_q[:] = SEC_QS[qs]
    pi = sec_policy(ba, tau)
    want = twin_sec_policy(ba.shared.sec_q, ba.shared.group_size, tau)
    assert np.isfinite(pi).all() and math.isclose(pi.sum(), 1.0, rel_tol=1e-12)
    np.testing.assert_allclose(pi, want, rtol=1e-12, atol=1e-300)
    live = ba.shared.group_size > 0
    assert (pi[~live] == 0).all()
    top = ba.shared.sec_q[live].max()
    assert (pi[live & (ba.shared.sec_q == top)] > 0).all()  # the best groups always keep their weight
    ids = sec_batch(ba, 40, 1, 3, "sec-tau", tau)  # draws and caps work at every tau
    assert np.unique(ids).size == 40 and (ba.group[ids] >= 0).all()


def test_sec_policy_random_q_and_tau_match_the_twin():
    rng = np.random.default_rng(7)
    for _ in range(300):
        n_groups = int(rng.integers(1, 9))
        size = rng.integers(0, 4, n_groups)
        size[int(rng.integers(0, n_groups))] = 1  # at least one live group
        ba = BeliefArrays.new(int(size.sum()))
        apply_metadata(ba, 0, None, np.repeat(np.arange(n_groups, dtype=np.int32), size))
        m = ba.shared.sec_q.size  # groups up to the last one holding a prompt
        q = rng.choice([0.0, 0.25, 0.5], m) + rng.uniform(0, 1e-3, m) * rng.integers(0, 2, m)
        ba.shared.sec_q[:] = q
        tau = float(10.0 ** rng.uniform(-323, 6))
        pi = sec_policy(ba, tau)
        np.testing.assert_allclose(pi, twin_sec_policy(q, ba.shared.group_size, tau), rtol=1e-11, atol=1e-300)


def test_sec_selects_at_the_smallest_tau_after_a_close():
    """tau 5e-324 once Q is learnt (a closed step with observations): the greedy policy, no error."""
    ba = sec_dataset(n=120, groups=(0, 1, 2))
    for step in range(3):
        ids, _ = select(
            ba, strategy="sec", params={"tau": 5e-324}, batch_size=10, step=step, seed=0, key="t", dataset_k=8
        )
        assert np.unique(ids).size == 10
        observe(ba, ids, np.arange(10) % 9)
        close(ba, "t")
    assert (ba.shared.sec_q > 0).any()


def test_sec_caps_a_category_at_its_size_and_draws_the_rest_elsewhere():
    ba = BeliefArrays.new(100)
    apply_metadata(ba, 0, None, np.array([0] * 3 + [1] * 97, np.int32))
    ba.shared.sec_q[:] = [50.0, 0.0]  # pi(0) ~ 1
    ids = sec_batch(ba, 20, 0, 0, "cap", 1.0)
    assert np.unique(ids).size == 20 and {0, 1, 2} <= set(ids.tolist())


def test_sec_walks_each_category_without_replacement_within_a_pass():
    ba = sec_dataset(n=80, groups=(0, 1, 2))
    members = groups_of(ba)
    counts = {g: [] for g in members}
    key = "pass"
    for step in range(20):
        ids, _ = select(ba, strategy="sec", params={}, batch_size=10, step=step, seed=0, key=key, dataset_k=8)
        for pid in ids:
            counts[int(ba.group[pid])].append(int(pid))
        observe(ba, ids, np.full(10, 4.0))
        close(ba, key)
    for g, walked in counts.items():
        size = members[g].size
        assert len(walked) >= 2 * size + 5  # the test crosses pass boundaries
        # The first pass holds every member once; afterwards each member is drawn as often as the others
        # give or take one (a pass boundary may repeat or pass over a few ids, as the uniform walk does).
        assert sorted(walked[:size]) == members[g].tolist()
        drawn = np.bincount(np.searchsorted(members[g], walked), minlength=size)
        assert drawn.min() >= len(walked) // size - 1 and drawn.max() <= -(-len(walked) // size) + 1


def test_sec_learns_q_from_the_mean_absolute_advantage():
    ba = BeliefArrays.new(6, sec_lr=0.5)
    apply_metadata(ba, 0, None, np.array([0, 0, 1, 1, 2, -1], np.int32))
    observe(ba, [0, 1, 2, 4], [4.0, 8.0, 0.0, 2.0])
    close(ba, "q")
    adv = naive.mean_abs_advantage
    expected = [0.5 * (adv(4, 8) + adv(8, 8)) / 2, 0.0, 0.5 * adv(2, 8)]
    np.testing.assert_allclose(ba.shared.sec_q, expected, rtol=1e-9)
    assert adv(4, 8) > adv(2, 8) > adv(8, 8) == 0  # 4/8 teaches more than 2/8; all-equal groups nothing
    close(ba, "q")  # nothing observed: every Q decays toward 0
    np.testing.assert_allclose(ba.shared.sec_q, np.array(expected) / 2, rtol=1e-9)


@pytest.mark.parametrize(("s", "t"), [(0, 1), (1, 1), (0, 8), (3, 8), (8, 8), (1, 2), (7, 16), (50, 100)])
def test_mean_absolute_advantage_matches_the_rewards(s, t):
    from selector_service.core.beliefs import mean_abs_advantage

    assert mean_abs_advantage(float(s), float(t)) == pytest.approx(
        naive.mean_abs_advantage(s, t), rel=1e-9, abs=1e-15
    )


def test_walk_positions_survive_a_copy_and_replicas_agree():
    ba = sec_dataset(n=200)
    twin = ba.copy()
    for step in range(5):
        for beliefs in (ba, twin):
            ids, _ = select(
                beliefs, strategy="sec", params={}, batch_size=16, step=step, seed=2, key="r", dataset_k=8
            )
            observe(beliefs, ids, np.arange(16) % 9)
            g_ids, _ = select(
                beliefs, strategy="greso", params={}, batch_size=16, step=step, seed=2, key="r", dataset_k=8
            )
            observe(beliefs, g_ids, np.arange(16) % 9)
            close(beliefs, "r")
    np.testing.assert_array_equal(ba.shared.sec_pos, twin.shared.sec_pos)
    assert ba.shared.header() == twin.shared.header()


def test_sec_position_crosses_a_pass_boundary_past_ids_already_walked():
    ba = BeliefArrays.new(40)
    apply_metadata(ba, 0, None, np.array([0] * 10 + [1] * 30, np.int32))
    ba.shared.sec_q[:] = [60.0, 0.0]  # every draw goes to category 0 while it has room
    ba.shared.sec_pos[0] = 8  # two members left in pass 0
    members = np.arange(10)
    order = twin_category_order(members, 0, "cross", 2)
    tail = order[8:10]
    walked = [pid for pid in order[10:] if pid not in tail]
    ids = sec_batch(ba, 6, 0, 0, "cross", 1.0)
    assert ids.tolist() == tail + walked[:4]
    observe(ba, ids, np.full(6, 4.0))
    advance_walks(ba, "cross")
    # Twin: walk the positions after 8; an id of the tail met again in pass 1 is passed over.
    pos = 8
    for pid in order[8:]:
        if pos >= 10 and pid in tail:
            pos += 1
            continue
        if pid not in ids:
            break
        pos += 1
    assert ba.shared.sec_pos[0] == pos
    assert sec_batch(ba, 1, 1, 0, "cross", 1.0)[0] == walked[4]


def test_sec_members_are_each_groups_ids_ascending():
    from selector_service.core.walks import sec_members

    rng = np.random.default_rng(9)
    ba = BeliefArrays.new(500)
    apply_metadata(ba, 0, None, rng.integers(-1, 7, 500).astype(np.int32))
    apply_metadata(ba, 100, None, rng.integers(-1, 9, 50).astype(np.int32))  # grows to 9 groups
    members, starts = sec_members(ba)
    assert starts.size == ba.shared.n_groups + 1 and starts[-1] == ba.shared.grouped
    for g in range(ba.shared.n_groups):
        np.testing.assert_array_equal(members[starts[g] : starts[g + 1]], np.flatnonzero(ba.group == g))
    apply_metadata(ba, 0, None, np.array([8], np.int32))  # an upload drops the cached index
    members, starts = sec_members(ba)
    assert members[starts[8]] == 0
