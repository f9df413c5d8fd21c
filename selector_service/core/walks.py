"""The walks of GRESO and SEC (docs/methods.md §7), with positions that the dataset advances at step close.

GRESO walks the concatenated epoch permutations of the dataset (epoch e: `epoch_permutation(n, key, e,
0)`) from its position `greso_pos`. A prompt whose trailing run of all-solved results is z_easy > 0 is
skipped with probability 1 - max(p_easy^z_easy, 0.01); otherwise, when its latest result was all-failed
(trailing run z_hard), with 1 - max(p_hard^z_hard, 0.01); a prompt without such a run is never skipped.
The first B survivors are the batch (an id met again across an epoch boundary is passed over). The draw
deciding a skip belongs to the walk position (output `offset` of `stream(key, epoch, 0, "greso-skip")`),
so the same position gives the same decision as long as the prompt's streak
and p_easy / p_hard are unchanged.

SEC draws B categories i.i.d. from pi = softmax(Q / tau) over the non-empty groups (inverse CDF of the
uniforms of `stream(key, step, seed, "sec-categories")`), and takes one prompt per draw from that
category's own walk: its members (ids of the group, ascending) in the order of a permutation per pass
(`stream(key, pass, 0, "sec-walk-<g>").permutation`), without replacement within a pass, from the category's position `sec_pos[g]` (a
walk that crosses into the next pass passes over the ids it already holds, as the uniform walk does). A
category drawn more often than it has members takes all of them and its extra draws are drawn again
among the others (ours: a batch has B distinct prompts).

Positions are dataset state, derived from the log (ours; the authors' dataloaders consume prompts as
they hand them out, and a select here writes nothing). At each step close, before anything resets the
step's states, `advance_walks` moves each position past the prompts the walk would have consumed:
walking from the position, a prompt observed at the step is consumed, a prompt not observed is
consumed only when GRESO skips it now (its streak and p_easy / p_hard are exactly what the select saw,
since neither changes until it is observed or the step closes), and the walk stops at the first prompt
the select would have returned but was not observed. So a trainer that observes every prompt of the
batch moves the walk exactly past the batch (skips included), one that observes part of it is offered
the rest again, and other observations move nothing. Both walks and the replay ignore the request seed
(GRESO: entirely; SEC: except for the category draws), because the close cannot know it.

Random numbers come from the counter-based generator (rng.stream), like every other random choice.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numba
import numpy as np
import numpy.typing as npt

from .rng import Stream, stream
from .select import epoch_permutation

if TYPE_CHECKING:
    from .beliefs import BeliefArrays

__all__ = [
    "GRESO_MIN_KEEP",
    "advance_walks",
    "greso_batch",
    "greso_keep_probability",
    "sec_batch",
    "sec_members",
    "sec_policy",
]

#: GRESO never skips with probability above 1 - GRESO_MIN_KEEP.
GRESO_MIN_KEEP = 0.01
#: Positions examined at a time by the walks (grows x2 per chunk).
_CHUNK = 4096


class WalkError(ValueError):
    """A walk cannot produce a batch (e.g. SEC without groups); the message says what to do."""


def greso_keep_probability(streak: np.ndarray, p_easy: float, p_hard: float) -> np.ndarray:
    """max(p_easy^z, 0.01) for a trailing all-solved run z > 0, max(p_hard^z, 0.01) for an all-failed
    run z > 0 (streak -z), 1 without a run (float64, elementwise)."""
    z = np.asarray(streak, dtype=np.float64)
    easy = np.maximum(np.power(p_easy, np.maximum(z, 0.0)), GRESO_MIN_KEEP)
    hard = np.maximum(np.power(p_hard, np.maximum(-z, 0.0)), GRESO_MIN_KEEP)
    keep: np.ndarray = np.where(z > 0, easy, np.where(z < 0, hard, 1.0))
    return keep


def _skip_draws(key: str, epoch: int, offset: int, count: int) -> np.ndarray:
    """The uniforms of positions offset..offset+count-1 of `epoch` (output i belongs to position i)."""
    return stream(key, epoch, 0, "greso-skip").uniforms(count, start=offset)


def _greso_chunks(
    n: int, key: str, pos: int, limit: int
) -> Iterator[tuple[int, npt.NDArray[np.int64], np.ndarray]]:
    """Yields (start position, ids, uniforms) chunks of the walk from `pos`, at most `limit` positions,
    never crossing an epoch boundary within a chunk."""
    chunk = _CHUNK
    end = pos + limit
    while pos < end:
        epoch, offset = divmod(pos, n)
        take = min(chunk, n - offset, end - pos)
        perm = epoch_permutation(n, key, epoch, 0)
        yield pos, perm[offset : offset + take].astype(np.int64), _skip_draws(key, epoch, offset, take)
        pos += take
        chunk *= 2


def greso_batch(ba: BeliefArrays, batch: int, key: str) -> np.ndarray:
    """GRESO's batch (int64[batch], walk order) from `ba.shared.greso_pos` (module docstring). When two
    epochs hold fewer than `batch` survivors, the batch is completed with skipped prompts in walk order."""
    n = ba.n
    if not 1 <= batch <= n:
        raise WalkError(f"batch size must lie in [1, {n}], got {batch}")
    sh = ba.shared
    first_epoch = sh.greso_pos // n
    picked: list[np.ndarray] = []
    skipped: list[np.ndarray] = []
    count = 0
    for start, ids, u in _greso_chunks(n, key, sh.greso_pos, 2 * n):
        keep = u < greso_keep_probability(ba.streak[ids], sh.p_easy, sh.p_hard)
        if start // n != first_epoch and picked:  # a later epoch may meet ids already picked
            keep &= ~np.isin(ids, np.concatenate(picked))
        survivors = ids[keep][: batch - count]
        picked.append(survivors)
        skipped.append(ids[~keep])
        count += survivors.size
        if count >= batch:
            break
    out: np.ndarray = np.concatenate(picked)
    if out.size < batch:
        rest = np.concatenate(skipped)
        rest = rest[~np.isin(rest, out)]
        _, first = np.unique(rest, return_index=True)
        out = np.concatenate([out, rest[np.sort(first)][: batch - out.size]])
    return out


def _greso_advance(ba: BeliefArrays, key: str) -> None:
    """Moves greso_pos past what the walk consumed at this step (module docstring)."""
    n = ba.n
    sh = ba.shared
    for start, ids, u in _greso_chunks(n, key, sh.greso_pos, 2 * n):
        consumed = ba.observed_at_step(ids) | (
            u >= greso_keep_probability(ba.streak[ids], sh.p_easy, sh.p_hard)
        )
        stop = np.flatnonzero(~consumed)
        if stop.size:
            sh.greso_pos = start + int(stop[0])
            return
        sh.greso_pos = start + ids.size


# ---------------------------------------------------------------- SEC


def sec_members(ba: BeliefArrays) -> tuple[np.ndarray, np.ndarray]:
    """(ids sorted by group then id, start offset of each group) for the grouped prompts; cached on the
    shared state until the next metadata upload."""
    sh = ba.shared
    if sh.members_cache is None:
        starts = np.zeros(sh.n_groups + 1, dtype=np.int64)
        np.cumsum(sh.group_size, out=starts[1:])
        count = int(starts[-1])
        members = (
            np.empty(count, dtype=np.int32)
            if ba.n <= np.iinfo(np.int32).max
            else np.empty(count, dtype=np.int64)
        )
        _bucket_by_group(ba.group, starts[:-1].copy(), members)
        sh.members_cache = (members, starts)
    return sh.members_cache


@numba.njit(nogil=True, cache=True)
def _bucket_by_group(
    group: npt.NDArray[np.int32],
    fill: npt.NDArray[np.int64],
    members: npt.NDArray[np.int32] | npt.NDArray[np.int64],
) -> None:
    """Counting sort: the ids of each group, ascending, at members[start_g ...] (fill starts at start_g).
    4 bytes per grouped prompt and nothing else, where an argsort would allocate 16."""
    for i in range(group.size):
        g = group[i]
        if g >= 0:
            members[fill[g]] = i
            fill[g] += 1


class _PassOrders:
    """LRU of the per-pass orders of SEC's categories (a permutation of 0..size-1, int32): a select and a
    close need a few elements of them, and computing one costs O(size). Bounded by elements held."""

    def __init__(self, max_elements: int = 1 << 26) -> None:
        self._items: OrderedDict[tuple[str, int, int, int], np.ndarray] = OrderedDict()
        self._held = 0
        self._max = max_elements
        self._lock = threading.Lock()

    def get(self, key: str, g: int, p: int, size: int) -> np.ndarray:
        k = (key, g, p, size)
        with self._lock:
            order = self._items.get(k)
            if order is not None:
                self._items.move_to_end(k)
                return order
        order = stream(key, p, 0, f"sec-walk-{g}").permutation(size)
        order.setflags(write=False)
        with self._lock:
            if k not in self._items:
                self._items[k] = order
                self._held += order.size
            while self._held > self._max and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._held -= old.size
        return order


_PASS_ORDERS = _PassOrders()


def _category_window(
    members: np.ndarray, g: int, pos: int, key: str, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Category g's walk from position `pos`: (ids int64, eligible bool) for at most `limit` positions
    (default: to the end of the next pass).

    Positions run over the concatenated pass orders (pass p: members in the order of stream(key, p, 0,
    "sec-walk-<g>").permutation); an id already met in the window (the next pass's copy of one still
    ahead in this pass) is not eligible and is passed over, so a window holds each member at most once.
    """
    size = members.size
    passes, offset = divmod(pos, size)
    end = 2 * size - offset if limit is None else min(limit, 2 * size - offset)
    first = _PASS_ORDERS.get(key, g, passes, size)
    head = members[first[offset : min(size, offset + end)]].astype(np.int64)
    if end <= size - offset:
        return head, np.ones(head.size, dtype=bool)
    tail = members[first[offset:]]
    nxt = members[_PASS_ORDERS.get(key, g, passes + 1, size)[: end - (size - offset)]].astype(np.int64)
    eligible = np.concatenate([np.ones(head.size, dtype=bool), ~np.isin(nxt, tail)])
    return np.concatenate([head, nxt]), eligible


def sec_policy(ba: BeliefArrays, tau: float) -> np.ndarray:
    """pi = softmax(Q / tau) over the groups, 0 for groups without prompts (float64[n_groups]).

    Computed as exp((Q - max Q) / tau): the max is subtracted before dividing, so every exponent is
    <= 0 and the largest ones are exactly 0. Dividing first overflows for tau below about 1e-308
    (Q / tau = inf, inf - inf = nan); this way any tau in (0, 1e6] gives a distribution whose weight
    sits on the groups with the largest Q (each a weight of exactly 1 before normalizing, so the sum
    is >= 1 and never underflows)."""
    sh = ba.shared
    live = sh.group_size > 0
    if not live.any():
        return np.zeros(live.size, dtype=np.float64)
    q = np.asarray(sh.sec_q, dtype=np.float64)
    top = q[live].max()
    with np.errstate(under="ignore", over="ignore"):
        weights: np.ndarray = np.where(live, np.exp(np.minimum((q - top) / tau, 0.0)), 0.0)
    policy: np.ndarray = weights / weights.sum()
    return policy


def sec_batch(ba: BeliefArrays, batch: int, step: int, seed: int, key: str, tau: float) -> np.ndarray:
    """SEC's batch (int64[batch]; module docstring): ids in the order of the category draws."""
    sh = ba.shared
    if sh.grouped == 0:
        raise WalkError(
            "strategy sec draws prompts by group and this dataset has none: upload groups with "
            "PUT /datasets/{name}/metadata first"
        )
    if batch > sh.grouped:
        raise WalkError(f"batch size {batch} is larger than the {sh.grouped} prompts that have a group")
    pi = sec_policy(ba, tau)
    sizes = sh.group_size
    draws = _categorical(pi, batch, stream(key, step, seed, "sec-categories"), 0)
    # Cap each category at its size and redraw the excess among categories with room, until none is left.
    redraw = 0
    while True:
        counts = np.bincount(draws, minlength=pi.size)
        rank = _rank_within(draws)
        over = rank >= sizes[draws]
        if not over.any():
            break
        room = np.where(counts < sizes, pi, 0.0)
        if not room.sum() > 0:  # pi underflowed to 0 where there is room (tiny tau): uniform there
            room = (counts < sizes).astype(np.float64)
        redraw += 1
        extra = _categorical(room, int(over.sum()), stream(key, step, seed, "sec-categories"), redraw)
        draws = np.concatenate([draws[~over], extra])
    members, starts = sec_members(ba)
    rank = _rank_within(draws)
    out = np.empty(batch, dtype=np.int64)
    for g in np.unique(draws):
        where = np.flatnonzero(draws == g)
        size = int(starts[g + 1] - starts[g])
        pos = int(sh.sec_pos[g])
        # Enough positions for where.size eligible ids: at most the rest of this pass is ineligible.
        limit = where.size + (size - pos % size if where.size > size - pos % size else 0)
        window, eligible = _category_window(members[starts[g] : starts[g + 1]], int(g), pos, key, limit)
        out[where] = window[eligible][rank[where]]
    return out


def _categorical(weights: np.ndarray, count: int, rng: Stream, part: int) -> np.ndarray:
    """`count` i.i.d. categories with probabilities proportional to `weights` (>= 0, some > 0): the
    inverse CDF at the uniforms of rng.child(part). A zero weight is never drawn."""
    cdf = np.cumsum(weights)
    u = rng.child(part).uniforms(count) * cdf[-1]
    last = int(np.flatnonzero(weights > 0)[-1])
    draws: npt.NDArray[np.int64] = np.minimum(np.searchsorted(cdf, u, side="right"), last).astype(np.int64)
    return draws


def _rank_within(draws: np.ndarray) -> np.ndarray:
    """For each draw, how many earlier draws chose the same category."""
    order = np.argsort(draws, kind="stable")
    sorted_draws = draws[order]
    first = np.searchsorted(sorted_draws, sorted_draws, side="left")
    rank = np.empty(draws.size, dtype=np.int64)
    rank[order] = np.arange(draws.size) - first
    return rank


def _sec_advance(ba: BeliefArrays, key: str) -> None:
    """Moves each category's position past its members observed at this step, in walk order."""
    sh = ba.shared
    active = np.flatnonzero(sh.step_adv_n > 0)  # categories with a result at this step
    if active.size == 0:
        return
    members, starts = sec_members(ba)
    for g in active:
        group_members = members[starts[g] : starts[g + 1]]
        size = group_members.size
        if size == 0:
            continue
        # Ids passed over in the next pass are ids of this pass's tail: the walk reaches them only when
        # the whole tail was observed, so "observed" alone decides what was consumed. At most
        # step_adv_n[g] members were observed: the walk stops within that many positions plus one,
        # unless it crosses into the next pass (then it may also pass over the tail's ids there).
        pos = int(sh.sec_pos[g])
        left = size - pos % size
        results = int(sh.step_adv_n[g])
        limit = results + 1 if results + 1 <= left else None
        window, _ = _category_window(group_members, int(g), pos, key, limit)
        stop = np.flatnonzero(~ba.observed_at_step(window))
        sh.sec_pos[g] += int(stop[0]) if stop.size else window.size


def advance_walks(ba: BeliefArrays, key: str) -> None:
    """Advances GRESO's and SEC's positions at a step close (module docstring); call it before the DPS
    close, which resets the step states of the observed set. Does nothing when the step had no results."""
    if ba.shared.step_counts[0] == 0:
        return
    _greso_advance(ba, key)
    if ba.shared.grouped:
        _sec_advance(ba, key)
