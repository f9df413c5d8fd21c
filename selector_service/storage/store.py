"""Redis layer: every key the service uses, the atomic write scripts, the log and the snapshots.

This module knows Redis and bytes, not math. All keys of one dataset share the hash tag ``{name}``, so a
Redis Cluster keeps a dataset on one shard and every Lua script touches keys of one slot only.

Keys (``P`` = settings.key_prefix, ``v1`` = the key layout's version `LAYOUT`, ``N`` = dataset name,
``U`` = dataset uid):

    P:v1:datasets            set of dataset names (the registry; the only key outside a dataset's slot)
    P:v1:{N}:spec            JSON spec of the dataset, including its uid (a new uid each creation)
    P:v1:{N}:meta            hash: uid, open_step, seq (sequence number of the last record appended),
                             trim (log ids below it were trimmed), snap (id of the current snapshot),
                             snap_covered (last log id it includes), snap_seq (its sequence number),
                             snap_chunks, snap_step
    P:v1:{N}:log             stream: one entry per accepted write, in the order every replica applies them
    P:v1:{N}:rid:U:<id>      request id -> "<log id> <body digest> <lag> <call token>" (expires after
                             request_id_ttl_s)
    P:v1:{rid:<id>}          request id -> "<dataset name> <uid> <call token>": the dataset incarnation it
                             was first used for and the call that claimed it (expires likewise); in a
                             slot of its own, so it is claimed in a step of its own (see `claim_request`)
    P:v1:{N}:snap:<sid>:<i>  chunk i of snapshot sid
    P:v1:{N}:snaplock        who is writing a snapshot now (expires unless its writer renews it)
    P:v1:{N}:snapw           ids of snapshots whose chunks are being written (the commit of one removes
                             the chunks of the others: writers that died or lost the lock)
    P:v1:{N}:closing         token of the select closing a step now (SET NX PX, expires on its own):
                             observe and metadata writes are refused with 'busy' while it is held (the
                             engine retries them), so a close's conditional commit is not starved

Log entries (stream fields): ``n`` sequence number (1, 2, 3, ... per dataset incarnation, written in the
same script that appends, so the log is numbered without holes), ``k`` kind (state.RecordKind: ``o``
observe, ``a`` advance, ``m`` metadata), ``s`` step (a metadata record carries the open step it was appended at, so it
closes nothing), ``r`` request id (observe), ``p`` payload (observe: packed arrays, see
state.pack_results; metadata: state.pack_metadata), ``q`` a select's note for the step history (advance
records; one at the open step advances nothing).

The replica protocol (what makes replicas and restarts agree, and what a replica checks rather than
assumes): what a replica has applied is always a contiguous prefix 1..n of the log. It reads the records
after its cursor together with the meta hash in one atomic script (`read_log`), and applies a record only
when its number is exactly one more than the last one applied. Any other number, or a log that moved on
while nothing after the cursor is left, means another replica's snapshot trimmed records this replica
has not applied: it then loads that snapshot (which covers them) and continues from there; it never skips.
A snapshot is written only from such a prefix and is committed only if its cover point is still in the
log with the sequence number it claims; the log is trimmed only below the snapshot being committed, in
the same script.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import time
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ParamSpec, TypeVar, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from selector_service.contract import dataset_settings
from selector_service.dataset.state import RecordKind
from selector_service.errors import DatasetGone, Unavailable

#: A dataset name, matched whole (`fullmatch`: `$` would also let a final newline through).
NAME_RE = re.compile(dataset_settings.NAME)
#: The key layout's version, in every key (above): the keys, the values they hold and the log records'
#: fields. Version 1 is the first layout; a change bumps it and migrates (the new code reads the keys of
#: the layout before it). Keys of another layout are never read as this one's: a value this layout
#: cannot hold (a request id binding or claim of another shape, a log record without a number) is
#: refused with an error that says so.
LAYOUT = "v1"

# Every script names its KEYS and ARGV in locals at its top, one per line (as arq's scripts do), and its
# body uses only those names. A script that appends a record writes its kind as ``<<NAME>>``.


def _kinds(script: str) -> str:
    """`script` with each ``<<NAME>>`` replaced by RecordKind.NAME's letter, so the log's record kinds are
    spelled once (state.RecordKind) for the scripts that append records and the state that applies them."""
    for kind in RecordKind:
        script = script.replace(f"<<{kind.name}>>", kind.value)
    assert "<<" not in script, "a script names a record kind RecordKind lacks"
    return script


# Appends an observe record atomically with its request id. Returns {status, log id or "", open step,
# lag, log length}; status: ok | dup (same id, same body: applied before) | conflict (same id, other
# body) | closed | ahead | gone | busy (a select is closing a step: nothing applied, send it again
# shortly).
# The request id is bound to "<log id> <digest> <lag> <call token>": the token names the engine's call
# that applied it, so the client library resending that same call (a lost reply) is answered ok, with
# what the first applied, not dup. When the HTTP client names its call (the Selector-Call header) the
# token is that name, so the client's own retry of a call whose reply was lost is answered ok as well.
# A step s < open step c is accepted as late evidence when c - s <= max lag (docs/methods.md §3.1); the answer
# and the remembered request id carry its lag, so a retry answers what the first call answered.
# With a selected step e (<= s), a step closed more than max lag ago is filed at the open step (the record's
# step is c, its field 'e' names e) instead of refused; the lag then counts from e (c - e), here and when
# the record is applied (DatasetState.apply_record). Without it nothing changes.
_OBSERVE = """
local meta_key = KEYS[1]
local log_key = KEYS[2]
local rid_key = KEYS[3]
local closing_key = KEYS[4]
local uid = ARGV[1]
local step_arg = ARGV[2]
local request_id = ARGV[3]
local payload = ARGV[4]
local rid_ttl_s = ARGV[5]
local max_step_gap = ARGV[6]
local digest = ARGV[7]
local max_lag = ARGV[8]
local call_token = ARGV[9]
local selected_arg = ARGV[10]  -- the selected step, '' = none
if redis.call('HGET', meta_key, 'uid') ~= uid then return {'gone', '', '-1', '0'} end
local seen = redis.call('GET', rid_key)
local open = tonumber(redis.call('HGET', meta_key, 'open_step') or '0')
if seen then
  local lid, seen_digest, lag, token = string.match(seen, '^(%S+) (%S+) (%S+) (%S+)$')
  if not lid then
    return redis.error_reply('request id binding ' .. seen .. ' is not one this key layout holds')
  end
  if seen_digest ~= digest then return {'conflict', lid, tostring(open), lag} end
  if token == call_token then
    return {'ok', lid, tostring(open), lag, tostring(redis.call('XLEN', log_key))}
  end
  return {'dup', lid, tostring(open), lag}
end
if redis.call('EXISTS', closing_key) == 1 then return {'busy', '', tostring(open), '0'} end
local step = tonumber(step_arg)
local selected = nil
if selected_arg ~= '' then selected = tonumber(selected_arg) end
if step < open - tonumber(max_lag) then
  if not selected then return {'closed', '', tostring(open), '0'} end
  step = open
end
if step - open > tonumber(max_step_gap) then return {'ahead', '', tostring(open), '0'} end
local n = redis.call('HINCRBY', meta_key, 'seq', 1)
local id
if selected then
  id = redis.call('XADD', log_key, '*', 'n', n, 'k', '<<OBSERVE>>', 's', tostring(step), 'r', request_id, 'p', payload,
                  'e', selected_arg)
else
  id = redis.call('XADD', log_key, '*', 'n', n, 'k', '<<OBSERVE>>', 's', step_arg, 'r', request_id, 'p', payload)
end
if step > open then
  redis.call('HSET', meta_key, 'open_step', tostring(step))
  open = step
end
local lag = tostring(open - (selected or step))
redis.call('SET', rid_key, id .. ' ' .. digest .. ' ' .. lag .. ' ' .. call_token, 'EX', tonumber(rid_ttl_s))
return {'ok', id, tostring(open), lag, tostring(redis.call('XLEN', log_key))}
"""

# Claims a request id for an incarnation. Returns the incarnation the request id belongs to
# ("<name> <uid>") and '1' when this call claimed it: stored as "<name> <uid> <token>", so a resend of
# the same call (a lost reply) still answers '1'.
_CLAIM = """
local claim_key = KEYS[1]
local owner = ARGV[1]  -- "<dataset name> <uid>"
local ttl_s = ARGV[2]
local call_token = ARGV[3]
local cur = redis.call('GET', claim_key)
if cur then
  local cur_owner, token = string.match(cur, '^(%S+ %S+) (%S+)$')
  if not cur_owner then
    return redis.error_reply('request id claim ' .. cur .. ' is not one this key layout holds')
  end
  if token == call_token then return {cur_owner, '1'} end
  return {cur_owner, '0'}
end
redis.call('SET', claim_key, owner .. ' ' .. call_token, 'EX', tonumber(ttl_s))
return {owner, '1'}
"""

# Deletes the claim while it still names that incarnation (whichever call token claimed it); 1 or 0.
_RELEASE = """
local claim_key = KEYS[1]
local owner = ARGV[1]  -- "<dataset name> <uid>"
local cur = redis.call('GET', claim_key)
if cur and string.match(cur, '^(%S+ %S+) %S+$') == owner then
  return redis.call('DEL', claim_key)
end
return 0
"""

# Appends a metadata record (docs/methods.md §6: pass rates and groups of a range of prompts) at the open
# step, numbered like every other record. The meta hash remembers the token of the last call that
# appended one (`meta_by`), so a resend of that call (a lost reply) answers ok with the same log id and
# appends nothing.
# Returns {status, log id or "", open step}; status: ok | gone | busy (a select is closing a step).
_METADATA = """
local meta_key = KEYS[1]
local log_key = KEYS[2]
local closing_key = KEYS[3]
local uid = ARGV[1]
local payload = ARGV[2]
local call_token = ARGV[3]
if redis.call('HGET', meta_key, 'uid') ~= uid then return {'gone', '', '-1'} end
local open = redis.call('HGET', meta_key, 'open_step') or '0'
local by = redis.call('HGET', meta_key, 'meta_by')
if by then
  local token, lid = string.match(by, '^(%S+) (%S+)$')
  if token == call_token then return {'ok', lid, open} end
end
if redis.call('EXISTS', closing_key) == 1 then return {'busy', '', open} end
local n = redis.call('HINCRBY', meta_key, 'seq', 1)
local id = redis.call('XADD', log_key, '*', 'n', n, 'k', '<<METADATA>>', 's', open, 'p', payload)
redis.call('HSET', meta_key, 'meta_by', call_token .. ' ' .. id)
return {'ok', id, open}
"""

# The conditional commit of a select (engine.Engine.select): it appends the select's record (opening
# the step, or a note at the open step) only when the log is still exactly what the caller applied (same
# uid, seq and open step), since the caller already closed the step and chose its batch from that state.
# A resend of a commit that was applied (its reply lost) finds its token in `closed_by` and answers ok
# with the same log id. Releases the closing reservation when the caller's token holds it.
# Returns {status, log id or "", open step}; status: ok | moved (the log grew: nothing appended) |
# behind | ahead | gone.
_CLOSE = """
local meta_key = KEYS[1]
local log_key = KEYS[2]
local closing_key = KEYS[3]
local uid = ARGV[1]
local step_arg = ARGV[2]
local max_step_gap = ARGV[3]
local note = ARGV[4]  -- the select's note for the step history
local applied_seq = ARGV[5]  -- the seq the caller's state applied up to
local applied_open = ARGV[6]  -- its open step
local close_token = ARGV[7]
if redis.call('HGET', meta_key, 'uid') ~= uid then return {'gone', '', '-1'} end
local open = tonumber(redis.call('HGET', meta_key, 'open_step') or '0')
local seq = redis.call('HGET', meta_key, 'seq') or '0'
if seq ~= applied_seq or open ~= tonumber(applied_open) then
  local by = redis.call('HGET', meta_key, 'closed_by')
  if by then
    local token, id = string.match(by, '^(%S+) (%S+)$')
    if token == close_token then
      if redis.call('GET', closing_key) == close_token then redis.call('DEL', closing_key) end
      return {'ok', id, tostring(open)}
    end
  end
  return {'moved', '', tostring(open)}
end
local step = tonumber(step_arg)
if step < open then return {'behind', '', tostring(open)} end
if step - open > tonumber(max_step_gap) then return {'ahead', '', tostring(open)} end
local n = redis.call('HINCRBY', meta_key, 'seq', 1)
local id = redis.call('XADD', log_key, '*', 'n', n, 'k', '<<ADVANCE>>', 's', step_arg, 'q', note)
if step > open then redis.call('HSET', meta_key, 'open_step', step_arg) end
redis.call('HSET', meta_key, 'closed_by', close_token .. ' ' .. id)
if redis.call('GET', closing_key) == close_token then redis.call('DEL', closing_key) end
return {'ok', id, tostring(math.max(step, open))}
"""

# Releases the closing reservation while `token` holds it; 1 or 0.
_UNRESERVE = """
local closing_key = KEYS[1]
local token = ARGV[1]
if redis.call('GET', closing_key) == token then return redis.call('DEL', closing_key) end
return 0
"""

# Returns {'created'|'exists'|'conflict', stored spec JSON}. The uid is new for each call, so a resend of
# the call that created the dataset (a lost reply) answers 'created' again.
_CREATE = """
local spec_key = KEYS[1]
local meta_key = KEYS[2]
local spec_json = ARGV[1]
local uid = ARGV[2]
local fingerprint = ARGV[3]  -- JSON of the user-visible fields
local cur = redis.call('GET', spec_key)
if cur then
  local ok, decoded = pcall(cjson.decode, cur)
  if ok and decoded['uid'] == uid then return {'created', cur} end  -- this call, resent
  if ok and decoded['fingerprint'] == fingerprint then return {'exists', cur} end
  return {'conflict', cur}
end
redis.call('SET', spec_key, spec_json)
redis.call('DEL', meta_key)
redis.call('HSET', meta_key, 'uid', uid, 'open_step', '0', 'seq', '0')
return {'created', spec_json}
"""

# Makes a fully written snapshot current and trims the log below what it covers.
# Returns {status, ids of snapshots whose chunks the caller deletes...}; status: ok; gone (dataset
# deleted); lost (the writer no longer holds the snapshot lock); stale (a newer snapshot is current, or
# its cover point has left the log); mismatch (the record at its cover point has another sequence
# number: the snapshot is not the prefix it claims to be, never committed). Only the lock holder
# commits, so on ok every other id in snapw is a writer that died or lost the lock; the replaced
# snapshot joins them there, and each stays in snapw until the caller has deleted its chunks (a caller
# that dies first leaves them to the next commit). A resent commit of the current snapshot is ok.
_COMMIT_SNAPSHOT = """
local meta_key = KEYS[1]
local log_key = KEYS[2]
local snaplock_key = KEYS[3]
local snapw_key = KEYS[4]
local uid = ARGV[1]
local snap_id = ARGV[2]
local covered_id = ARGV[3]
local chunk_count = ARGV[4]
local open_step = ARGV[5]  -- the open step it covers
local trim = ARGV[6]  -- '1': trim the log below covered_id
local covered_seq = ARGV[7]  -- the sequence number of the covered record
local owner = ARGV[8]  -- the snapshot lock's owner
local function older(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end
redis.call('SREM', snapw_key, snap_id)
if redis.call('HGET', meta_key, 'uid') ~= uid then return {'gone'} end
if redis.call('HGET', meta_key, 'snap') == snap_id then
  return {'ok', unpack(redis.call('SMEMBERS', snapw_key))}
end
if redis.call('GET', snaplock_key) ~= owner then return {'lost'} end
local cur = redis.call('HGET', meta_key, 'snap_covered')
if cur and not older(cur, covered_id) then return {'stale'} end
local at = redis.call('XRANGE', log_key, covered_id, covered_id)
if #at == 0 then return {'stale'} end
local fields = at[1][2]
for i = 1, #fields, 2 do
  if fields[i] == 'n' and fields[i + 1] ~= covered_seq then return {'mismatch'} end
end
local replaced = redis.call('HGET', meta_key, 'snap')
if replaced then redis.call('SADD', snapw_key, replaced) end
redis.call('HSET', meta_key, 'snap', snap_id, 'snap_covered', covered_id, 'snap_chunks', chunk_count,
           'snap_step', open_step, 'snap_seq', covered_seq)
if trim == '1' then
  redis.call('XTRIM', log_key, 'MINID', covered_id)
  redis.call('HSET', meta_key, 'trim', covered_id)
end
return {'ok', unpack(redis.call('SMEMBERS', snapw_key))}
"""

# Takes the lock (SET NX PX) for `owner`; 1 when `owner` holds it afterwards (a resend of the call that
# took it answers 1 again), else 0.
_TAKE_LOCK = """
local lock_key = KEYS[1]
local owner = ARGV[1]
local ttl_ms = ARGV[2]
local cur = redis.call('GET', lock_key)
if cur == owner then return 1 end
if cur then return 0 end
redis.call('SET', lock_key, owner, 'PX', tonumber(ttl_ms))
return 1
"""

# Extends the lock when `owner` still holds it; 1 or 0.
_RENEW_LOCK = """
local lock_key = KEYS[1]
local owner = ARGV[1]
local ttl_ms = ARGV[2]
if redis.call('GET', lock_key) ~= owner then return 0 end
redis.call('PEXPIRE', lock_key, tonumber(ttl_ms))
return 1
"""

# The meta hash, the log length and up to `count` records from the first id, in one atomic step: the
# records are exactly those the meta hash (seq, trim, snap) describes, with no snapshot commit or trim in
# between.
_READ = """
local meta_key = KEYS[1]
local log_key = KEYS[2]
local first_id = ARGV[1]  -- '-' or '(<cursor>'
local count = ARGV[2]
local meta = redis.call('HGETALL', meta_key)
local len = redis.call('XLEN', log_key)
local entries = redis.call('XRANGE', log_key, first_id, '+', 'COUNT', tonumber(count))
return {meta, len, entries}
"""

# Creates a dataset whose beliefs start from an imported snapshot (chunks already written).
# Returns 'created' or 'exists' (the name is taken; nothing changed).
_IMPORT = """
local spec_key = KEYS[1]
local meta_key = KEYS[2]
local log_key = KEYS[3]
local spec_json = ARGV[1]
local uid = ARGV[2]
local snap_id = ARGV[3]
local covered_id = ARGV[4]
local chunk_count = ARGV[5]
local open_step = ARGV[6]
if redis.call('EXISTS', spec_key) == 1 then
  if redis.call('HGET', meta_key, 'uid') == uid then return 'created' end  -- a resent import
  return 'exists'
end
redis.call('SET', spec_key, spec_json)
redis.call('DEL', meta_key, log_key)
redis.call('HSET', meta_key, 'uid', uid, 'open_step', open_step, 'seq', '0', 'snap', snap_id,
           'snap_covered', covered_id, 'snap_chunks', chunk_count, 'snap_step', open_step, 'snap_seq', '0')
return 'created'
"""


class StoreError(Exception):
    """The store answered out of contract: a snapshot chunk missing (SnapshotMissing), the snapshot lock
    lost while writing, a snapshot that is not the log prefix it claims to be."""


class SnapshotMissing(StoreError):
    """A chunk of a snapshot is missing: a newer snapshot replaced it while it was read (retry with the
    current one), or the store lost it (eviction, no persistence)."""


class WriteStatus(StrEnum):
    """What a write script answered (a dataset gone raises DatasetGone instead)."""

    OK = "ok"  # applied (or, for a resend of the call that applied it, applied before)
    DUP = "dup"  # observe: same request id, same body, applied by an earlier call
    CONFLICT = "conflict"  # observe: same request id, another body
    CLOSED = "closed"  # observe: the step is closed (later than max lag)
    AHEAD = "ahead"  # the step is further ahead of the open step than max_step_gap
    BUSY = "busy"  # observe, metadata: a select is closing a step; send it again shortly
    MOVED = "moved"  # close: the log grew since the state the caller applied; nothing appended
    BEHIND = "behind"  # close: the step is below the open step

    @property
    def refused(self) -> bool:
        """The write was refused with nothing recorded, not even its request id: a later call with the
        same request id is a new request."""
        return self in (WriteStatus.CLOSED, WriteStatus.AHEAD, WriteStatus.BUSY)


class CreateStatus(StrEnum):
    """What a create answered: the dataset created (by this call, or by a resend of it), the name held
    by the same spec already, or by another spec."""

    CREATED = "created"
    EXISTS = "exists"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class WriteResult:
    status: WriteStatus
    log_id: str
    open_step: int
    lag: int = 0
    log_length: int = 0


#: One log record as read: its stream id and its fields (names decoded, values as stored).
LogEntry = tuple[str, dict[str, bytes]]

P = ParamSpec("P")
R = TypeVar("R")


def _reachable(method: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """Makes a store call that fails to reach the store raise Unavailable (503), what every caller
    answers for it, instead of redis-py's RedisError."""

    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except RedisError as exc:
            raise Unavailable(
                f"the belief store is unreachable ({type(exc).__name__}: {exc}); retry later"
            ) from exc

    return call


@dataclass(frozen=True)
class LogView:
    """What one atomic `read_log` saw: the meta hash, the log length and the records after a cursor."""

    meta: dict[str, str]
    length: int
    entries: list[LogEntry]

    @property
    def seq(self) -> int:
        """Sequence number of the last record appended to the log (0: none)."""
        return int(self.meta.get("seq", 0))


def parse_id(log_id: str) -> tuple[int, int]:
    """Stream ids compare as (milliseconds, sequence) pairs, not as strings."""
    if not log_id:
        return (0, 0)
    ms, _, seq = log_id.partition("-")
    return (int(ms), int(seq or 0))


def _call_token() -> str:
    """A new token for one call of a write script. The script's arguments carry it, so the client
    library's resend of that call after a lost reply (connect() retries once on a connection error)
    carries the same token, and the script recognises its own first attempt by it."""
    return uuid.uuid4().hex[:16]


def _client_call_token(call: str) -> str:
    """The call token of a client's call id (contract.CALL_ID): prefixed, so that it is never one of
    `_call_token`'s."""
    return f"c.{call}"


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _status(name: str, raw: Any) -> WriteStatus:
    """A write script's status; DatasetGone when it answered that the incarnation it named is gone."""
    status = _s(raw)
    if status == "gone":
        raise DatasetGone(name)
    return WriteStatus(status)


class Keys:
    """Builds every key; names are validated here so nothing unvalidated reaches Redis."""

    def __init__(self, prefix: str) -> None:
        self.prefix = f"{prefix}:{LAYOUT}"
        self.registry = f"{self.prefix}:datasets"

    def _base(self, name: str) -> str:
        if not NAME_RE.fullmatch(name):
            raise ValueError(f"invalid dataset name {name!r}")
        return f"{self.prefix}:{{{name}}}"

    def spec(self, name: str) -> str:
        return f"{self._base(name)}:spec"

    def meta(self, name: str) -> str:
        return f"{self._base(name)}:meta"

    def log(self, name: str) -> str:
        return f"{self._base(name)}:log"

    def rid(self, name: str, uid: str, request_id: str) -> str:
        return f"{self._base(name)}:rid:{uid}:{request_id}"

    def snap_chunk(self, name: str, snap_id: str, index: int) -> str:
        return f"{self._base(name)}:snap:{snap_id}:{index}"

    def snaplock(self, name: str) -> str:
        return f"{self._base(name)}:snaplock"

    def snapw(self, name: str) -> str:
        return f"{self._base(name)}:snapw"

    def closing(self, name: str) -> str:
        return f"{self._base(name)}:closing"

    def claim(self, request_id: str) -> str:
        # Hash-tagged by the request id: independent of any dataset's slot (see `Store.claim_request`).
        return f"{self.prefix}:{{rid:{request_id}}}"

    def rid_pattern(self, name: str) -> str:
        return f"{self._base(name)}:rid:*"

    def snap_pattern(self, name: str) -> str:
        return f"{self._base(name)}:snap:*"


async def connect(url: str, timeout_s: float) -> aioredis.Redis | RedisCluster:
    """Connects to a standalone server or, when the server runs in cluster mode, to the whole cluster."""
    probe = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        info = await probe.info("cluster")
    finally:
        await probe.aclose()
    if info.get("cluster_enabled") in (1, "1"):
        return RedisCluster.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    # After a store restart every pooled connection is closed on the server's side, and the first command
    # sent on one fails. So a command that fails to connect or finds its connection closed is sent again,
    # once, on a fresh connection (never after a timeout: the store may just be slow). Every write is
    # safe to send twice, and a second copy of a call answers what the first applied: observe, metadata,
    # request-id claims and a select's close carry a token per call (`_call_token`) that the script
    # remembers, a create carries the new uid, an import and a snapshot commit their snapshot id, and
    # lock takes their owner.
    retry = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
    return aioredis.Redis.from_url(
        url,
        health_check_interval=30,
        retry=retry,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )


async def durability_problems(client: aioredis.Redis | RedisCluster) -> list[str]:
    """What the store's own configuration says against docs/operations.md's requirements: no append-only
    file (a restart loses acknowledged writes) or an eviction policy (an evicted request id counts a
    retry twice, an evicted log loses observations). Empty when all is well or when the server does not
    let us read its configuration (managed services often refuse CONFIG)."""
    try:
        config = await client.config_get("appendonly")
        config.update(await client.config_get("maxmemory-policy"))
    except Exception:  # CONFIG refused, renamed or unsupported: nothing to say
        return []
    values = {_s(k): _s(v) for k, v in config.items()}
    problems = []
    if values.get("appendonly", "yes") != "yes":
        problems.append(
            "the store runs without an append-only file (appendonly no): a store restart loses every "
            "acknowledged observation since its last RDB save; run it with --appendonly yes"
        )
    policy = values.get("maxmemory-policy", "noeviction")
    if policy != "noeviction":
        problems.append(
            f"the store may evict keys (maxmemory-policy {policy}): an evicted request id lets a retry count "
            "twice and an evicted log loses observations; run it with --maxmemory-policy noeviction"
        )
    return problems


class Store:
    """Async access to the datasets' keys, raising the service's own errors: Unavailable when the store
    cannot be reached, DatasetGone when a write names an incarnation that is gone, and StoreError for
    an answer out of contract (a snapshot chunk missing: SnapshotMissing; the snapshot lock lost while
    writing; a snapshot that is not the log prefix it claims to be)."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        prefix: str,
        request_id_ttl_s: int,
        max_step_gap: int = 1000,
    ) -> None:
        self.r = client
        self.keys = Keys(prefix)
        self.rid_ttl = request_id_ttl_s
        self.max_step_gap = max_step_gap
        self._observe = client.register_script(_kinds(_OBSERVE))
        self._metadata = client.register_script(_kinds(_METADATA))
        self._create = client.register_script(_CREATE)
        self._commit = client.register_script(_COMMIT_SNAPSHOT)
        self._import = client.register_script(_IMPORT)
        self._read = client.register_script(_READ)
        self._renew = client.register_script(_RENEW_LOCK)
        self._claim = client.register_script(_CLAIM)
        self._release = client.register_script(_RELEASE)
        self._close = client.register_script(_kinds(_CLOSE))
        self._take_lock = client.register_script(_TAKE_LOCK)
        self._unreserve = client.register_script(_UNRESERVE)

    async def close(self) -> None:
        await self.r.aclose()

    @_reachable
    async def ping(self) -> bool:
        return bool(await self.r.ping())

    # ---- datasets -------------------------------------------------------------------------------
    @_reachable
    async def create_dataset(
        self, name: str, spec: dict[str, Any], fingerprint: str
    ) -> tuple[CreateStatus, dict[str, Any]]:
        """Creates dataset `name` with a new uid unless the name is taken; returns what the create
        answered and the stored spec document (this one's, or the one holding the name)."""
        uid = uuid.uuid4().hex
        doc = dict(spec, uid=uid, fingerprint=fingerprint)
        status, stored = await self._create(
            keys=[self.keys.spec(name), self.keys.meta(name)], args=[json.dumps(doc), uid, fingerprint]
        )
        await self.r.sadd(self.keys.registry, name)
        return CreateStatus(_s(status)), json.loads(_s(stored))

    @_reachable
    async def write_import_chunks(
        self, name: str, chunks: AsyncIterable[bytes | memoryview]
    ) -> tuple[str, int]:
        """Writes the chunks of an imported snapshot as they arrive; returns (snapshot id, chunk count).
        Nothing refers to them until `commit_import`; on an error they are removed and it re-raises."""
        snap_id = uuid.uuid4().hex[:16]
        count = 0
        try:
            async for chunk in chunks:
                await self.r.set(self.keys.snap_chunk(name, snap_id, count), chunk)
                count += 1
                del chunk  # released before the producer makes the next one
        except BaseException:
            with contextlib.suppress(RedisError, OSError):
                await self._delete_chunks(name, snap_id, count + 1)
            raise
        return snap_id, count

    @_reachable
    async def commit_import(
        self,
        name: str,
        spec: dict[str, Any],
        fingerprint: str,
        uid: str,
        covered_id: str,
        open_step: int,
        snap_id: str,
        count: int,
        replace: bool = False,
    ) -> bool:
        """Creates `name` from the chunks `write_import_chunks` wrote; with `replace`, deletes the dataset
        of that name first (keeping those chunks). False (and the chunks removed) when the name is taken."""
        if replace:
            await self.delete_dataset(name, keep_snap=snap_id)
        doc = dict(spec, uid=uid, fingerprint=fingerprint)
        status = _s(
            await self._import(
                keys=[self.keys.spec(name), self.keys.meta(name), self.keys.log(name)],
                args=[json.dumps(doc), uid, snap_id, covered_id, count, open_step],
            )
        )
        if status != "created":
            await self._delete_chunks(name, snap_id, count)
            return False
        await self.r.sadd(self.keys.registry, name)
        return True

    @_reachable
    async def discard_chunks(self, name: str, snap_id: str, count: int) -> None:
        """Removes chunks `write_import_chunks` wrote that no dataset refers to (an import given up)."""
        await self._delete_chunks(name, snap_id, count)

    @_reachable
    async def get_spec(self, name: str) -> dict[str, Any] | None:
        raw = await self.r.get(self.keys.spec(name))
        return json.loads(raw) if raw else None

    @_reachable
    async def list_datasets(self) -> list[str]:
        names = sorted(_s(n) for n in await self.r.smembers(self.keys.registry))
        return names

    @_reachable
    async def delete_dataset(self, name: str, keep_snap: str | None = None) -> bool:
        """Deletes every key of dataset `name` (but the chunks of snapshot `keep_snap`, an import's that
        replaces it); whether it existed."""
        existed = bool(await self.r.delete(self.keys.spec(name)))
        await self.r.delete(
            self.keys.meta(name),
            self.keys.log(name),
            self.keys.snaplock(name),
            self.keys.snapw(name),
            self.keys.closing(name),
        )
        keep = None if keep_snap is None else self.keys.snap_chunk(name, keep_snap, 0).rsplit(":", 1)[0] + ":"
        for pattern in (self.keys.snap_pattern(name), self.keys.rid_pattern(name)):
            await self._delete_matching(pattern, keep)
        await self.r.srem(self.keys.registry, name)
        return existed

    async def _delete_matching(self, pattern: str, keep: str | None = None) -> None:
        """Deletes the keys matching `pattern`, but those starting with `keep`."""
        batch: list[Any] = []
        async for key in self.r.scan_iter(match=pattern, count=1000):
            if keep is not None and _s(key).startswith(keep):
                continue
            batch.append(key)
            if len(batch) >= 500:
                await self.r.delete(*batch)
                batch.clear()
        if batch:
            await self.r.delete(*batch)

    # ---- writes ---------------------------------------------------------------------------------
    @_reachable
    async def claim_request(self, name: str, uid: str, request_id: str) -> tuple[str, str, bool]:
        """Claims `request_id` for incarnation `uid` of dataset `name`; returns the dataset name and uid it
        belongs to (`name`, `uid` unless it was first used for another dataset or an earlier incarnation
        of this one, within the request id TTL) and whether this call made the claim.

        Its own step, not part of the observe script: the claim lives outside the dataset's hash slot
        (a Redis Cluster script may only touch one slot). Claiming first is safe in every interleaving:
        a claim whose observe never ran (a crash in between) only binds the id to the incarnation its
        retry goes to anyway (unless that incarnation is replaced meanwhile: then the retry is refused,
        never applied).
        """
        owner, created = await self._claim(
            keys=[self.keys.claim(request_id)], args=[f"{name} {uid}", self.rid_ttl, _call_token()]
        )
        owner_name, _, owner_uid = _s(owner).partition(" ")
        return owner_name, owner_uid, _s(created) == "1"

    @_reachable
    async def release_request(self, name: str, uid: str, request_id: str) -> None:
        """Undoes a claim this process made for an observe the dataset refused (nothing applied), so a
        refused request leaves no trace; a claim that meanwhile names another incarnation is left alone."""
        await self._release(keys=[self.keys.claim(request_id)], args=[f"{name} {uid}"])

    @_reachable
    async def append_observe(
        self,
        name: str,
        uid: str,
        step: int,
        request_id: str,
        payload: bytes,
        digest: str,
        max_lag: int = 0,
        selected_step: int | None = None,
        call: str | None = None,
    ) -> WriteResult:
        """Appends an observe record atomically with its request id (_OBSERVE above); DatasetGone when
        incarnation `uid` is gone. `call`: the client's id of the call (its Selector-Call header, the same
        on each of its attempts), stored as the call token instead of one drawn for this call."""
        res = await self._observe(
            keys=[
                self.keys.meta(name),
                self.keys.log(name),
                self.keys.rid(name, uid, request_id),
                self.keys.closing(name),
            ],
            args=[
                uid,
                step,
                request_id,
                payload,
                self.rid_ttl,
                self.max_step_gap,
                digest,
                max_lag,
                _client_call_token(call) if call else _call_token(),
                "" if selected_step is None else selected_step,
            ],
        )
        length = int(_s(res[4])) if len(res) > 4 else 0
        return WriteResult(_status(name, res[0]), _s(res[1]), int(_s(res[2])), int(_s(res[3])), length)

    @_reachable
    async def append_metadata(self, name: str, uid: str, payload: bytes | memoryview) -> WriteResult:
        """Appends a metadata record (status ok), or reports a close in flight (busy); DatasetGone when
        incarnation `uid` is gone."""
        res = await self._metadata(
            keys=[self.keys.meta(name), self.keys.log(name), self.keys.closing(name)],
            args=[uid, payload, _call_token()],
        )
        return WriteResult(_status(name, res[0]), _s(res[1]), int(_s(res[2])))

    @_reachable
    async def reserve_close(self, name: str, token: str, ttl_ms: int) -> bool:
        """Takes the dataset's closing reservation for `token` (SET NX PX); False when another holds it."""
        return bool(await self._take_lock(keys=[self.keys.closing(name)], args=[token, ttl_ms]))

    @_reachable
    async def renew_close(self, name: str, token: str, ttl_ms: int) -> bool:
        """Extends the closing reservation by `ttl_ms` while `token` holds it; False when it does not."""
        return bool(await self._renew(keys=[self.keys.closing(name)], args=[token, ttl_ms]))

    @_reachable
    async def release_close(self, name: str, token: str) -> None:
        """Gives the closing reservation back when `token` still holds it."""
        await self._unreserve(keys=[self.keys.closing(name)], args=[token])

    @_reachable
    async def commit_close(
        self, name: str, uid: str, step: int, note: str, seq: int, open_step: int, token: str
    ) -> WriteResult:
        """Appends a select's record only if the log is still at `seq` with `open_step` (_CLOSE above);
        DatasetGone when incarnation `uid` is gone."""
        res = await self._close(
            keys=[self.keys.meta(name), self.keys.log(name), self.keys.closing(name)],
            args=[uid, step, self.max_step_gap, note, seq, open_step, token],
        )
        return WriteResult(_status(name, res[0]), _s(res[1]), int(_s(res[2])))

    # ---- reads ----------------------------------------------------------------------------------
    @_reachable
    async def read_meta(self, name: str) -> dict[str, str]:
        raw = await self.r.hgetall(self.keys.meta(name))
        return {_s(k): _s(v) for k, v in raw.items()}

    @_reachable
    async def read_seqs(self, names: list[str]) -> dict[str, int]:
        """Each dataset's record count (the meta hash's seq; 0 for one that has none), in one pipelined
        round trip: what /metrics ranks datasets by activity with."""
        if not names:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hget(self.keys.meta(name), "seq")
        values = await pipe.execute()
        return {name: int(_s(v)) if v is not None else 0 for name, v in zip(names, values, strict=True)}

    @_reachable
    async def read_log(self, name: str, after_id: str, count: int) -> LogView:
        """One round trip, one atomic step: the meta hash, the log length and the first `count` records
        after `after_id` ("" = from the start). Records are (id, {field: value}) pairs."""
        meta_raw, length, raw = await self._read(
            keys=[self.keys.meta(name), self.keys.log(name)],
            args=[f"({after_id}" if after_id else "-", count],
        )
        meta = {_s(meta_raw[i]): _s(meta_raw[i + 1]) for i in range(0, len(meta_raw), 2)}
        entries = [
            (_s(log_id), {_s(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}) for log_id, flat in raw
        ]
        return LogView(meta, int(length), entries)

    # ---- snapshots ------------------------------------------------------------------------------
    @_reachable
    async def try_snapshot_lock(self, name: str, owner: str, ttl_ms: int) -> bool:
        return bool(await self._take_lock(keys=[self.keys.snaplock(name)], args=[owner, ttl_ms]))

    @_reachable
    async def release_snapshot_lock(self, name: str, owner: str) -> None:
        cur = await self.r.get(self.keys.snaplock(name))
        if cur is not None and _s(cur) == owner:
            await self.r.delete(self.keys.snaplock(name))

    @_reachable
    async def renew_snapshot_lock(self, name: str, owner: str, ttl_ms: int) -> bool:
        """Extends the snapshot lock by `ttl_ms` if `owner` still holds it; False when it was lost."""
        return bool(await self._renew(keys=[self.keys.snaplock(name)], args=[owner, ttl_ms]))

    @_reachable
    async def write_snapshot(
        self,
        name: str,
        uid: str,
        covered_id: str,
        covered_seq: int,
        open_step: int,
        chunks: AsyncIterable[bytes | memoryview],
        owner: str,
        lock_ttl_ms: int,
        trim: bool = True,
    ) -> bool:
        """Writes the chunks as they arrive (counting them), then switches the dataset to them atomically.

        The caller holds the snapshot lock as `owner`; it is renewed while chunks are written (a writer
        that dies leaves it for at most `lock_ttl_ms`), and the commit happens only while it is held.
        Chunks are consumed one at a time, so a producer that compresses as it goes never needs the whole
        snapshot in memory. Returns False (and removes what it wrote) when, at the commit, the dataset is
        gone, the lock was lost, or a newer snapshot won; raises StoreError (after removing what it wrote)
        when the lock cannot be renewed while chunks are written, or when the record at `covered_id` does
        not carry `covered_seq` (the state the snapshot was taken from is not the log prefix it claims to
        be). On an error while writing chunks, removes those written so far and re-raises. A successful
        commit removes the replaced snapshot and every orphaned one.
        """
        snap_id = uuid.uuid4().hex[:16]
        count = 0
        renewed = time.monotonic()
        try:
            await self.r.sadd(self.keys.snapw(name), snap_id)
            async for chunk in chunks:
                await self.r.set(self.keys.snap_chunk(name, snap_id, count), chunk)
                count += 1
                del chunk  # released before the producer makes the next one
                if time.monotonic() - renewed > lock_ttl_ms / 3000:
                    if not await self.renew_snapshot_lock(name, owner, lock_ttl_ms):
                        raise StoreError(f"lost the snapshot lock of dataset {name!r} while writing")
                    renewed = time.monotonic()
        except BaseException:
            # Nothing refers to these chunks yet. (Not after the commit below: a commit that failed on
            # the client side may still have been applied, and its chunks are then the current snapshot.)
            with contextlib.suppress(RedisError, OSError):
                await self._delete_chunks(name, snap_id, count + 1)
                await self.r.srem(self.keys.snapw(name), snap_id)
            raise
        out = await self._commit(
            keys=[self.keys.meta(name), self.keys.log(name), self.keys.snaplock(name), self.keys.snapw(name)],
            args=[uid, snap_id, covered_id, count, open_step, "1" if trim else "0", covered_seq, owner],
        )
        status = _s(out[0])
        if status != "ok":
            await self._delete_chunks(name, snap_id, count)
            if status == "mismatch":
                raise StoreError(
                    f"snapshot of dataset {name!r} at {covered_id} claims record number {covered_seq}, "
                    "which the log does not hold there; it was dropped"
                )
            return False
        for other in out[1:]:
            await self._delete_chunks(name, _s(other), None)
            await self.r.srem(self.keys.snapw(name), other)
        return True

    async def _delete_chunks(self, name: str, snap_id: str, count: int | None) -> None:
        """Deletes chunks 0..count-1 of a snapshot; with count None, from 0 up to the first one missing
        (a writer writes them in order), in batches."""
        if count is not None:
            for lo in range(0, count, 256):
                await self.r.delete(
                    *(self.keys.snap_chunk(name, snap_id, i) for i in range(lo, min(count, lo + 256)))
                )
            return
        lo = 0
        while True:
            batch = [self.keys.snap_chunk(name, snap_id, i) for i in range(lo, lo + 64)]
            if await self.r.delete(*batch) < len(batch):
                return
            lo += 64

    @_reachable
    async def read_snapshot_chunk(self, name: str, snap_id: str, index: int) -> bytes:
        """Chunk `index` of snapshot `snap_id`; SnapshotMissing when it is missing (replaced, evicted or
        deleted)."""
        part = await self.r.get(self.keys.snap_chunk(name, snap_id, index))
        if part is None:
            raise SnapshotMissing(f"snapshot {snap_id} of dataset {name!r} is missing chunk {index}")
        return cast(bytes, part)  # the client decodes no responses (connect): values are bytes
