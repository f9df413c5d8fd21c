"""Redis layer: every key the service uses, the atomic write scripts, the log and the snapshots.

This module knows Redis and bytes, not math. All keys of one dataset share the hash tag ``{name}``, so a
Redis Cluster keeps a dataset on one shard and every Lua script touches keys of one slot only.

Keys (``P`` = settings.key_prefix, ``v1`` = layout version, ``N`` = dataset name, ``U`` = dataset uid):

    P:v1:datasets            set of dataset names (the registry; the only key outside a dataset's slot)
    P:v1:{N}:spec            JSON spec of the dataset, including its uid (a new uid each creation)
    P:v1:{N}:meta            hash: uid, open_step, trim (log ids below it were trimmed), snap (id of the
                             current snapshot), snap_covered (last log id it includes), snap_chunks
    P:v1:{N}:log             stream: one entry per accepted write, in the order every replica applies them
    P:v1:{N}:rid:U:<id>      request id -> log id of its entry (expires after request_id_ttl_s)
    P:v1:{N}:snap:<sid>:<i>  chunk i of snapshot sid
    P:v1:{N}:snaplock        who is writing a snapshot now (expires)

Log entries (stream fields): ``k`` kind (``o`` observe, ``a`` advance), ``s`` step, ``r`` request id
(observe), ``p`` payload (observe; packed arrays, see engine.pack_results).
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LAYOUT = "v1"

# KEYS: 1 meta, 2 log, 3 rid key.  ARGV: 1 uid, 2 step, 3 request id, 4 payload, 5 rid ttl (s),
# 6 max step gap.  Returns {status, log id or "", open step}; status: ok | dup | closed | ahead | gone.
_OBSERVE = """
local uid = redis.call('HGET', KEYS[1], 'uid')
if uid ~= ARGV[1] then return {'gone', '', '-1'} end
local seen = redis.call('GET', KEYS[3])
local open = tonumber(redis.call('HGET', KEYS[1], 'open_step') or '0')
if seen then return {'dup', seen, tostring(open)} end
local step = tonumber(ARGV[2])
if step < open then return {'closed', '', tostring(open)} end
if step - open > tonumber(ARGV[6]) then return {'ahead', '', tostring(open)} end
local id = redis.call('XADD', KEYS[2], '*', 'k', 'o', 's', ARGV[2], 'r', ARGV[3], 'p', ARGV[4])
if step > open then redis.call('HSET', KEYS[1], 'open_step', ARGV[2]) end
redis.call('SET', KEYS[3], id, 'EX', tonumber(ARGV[5]))
return {'ok', id, ARGV[2]}
"""

# KEYS: 1 meta, 2 log.  ARGV: 1 uid, 2 step, 3 max step gap.  Opens `step` (closing every earlier step)
# when it is ahead by at most the gap (each closed step costs a DPS update of every prompt when applied).
# Returns {status, log id or "", open step}; status: ok (advanced) | same | behind | ahead | gone.
_ADVANCE = """
local uid = redis.call('HGET', KEYS[1], 'uid')
if uid ~= ARGV[1] then return {'gone', '', '-1'} end
local open = tonumber(redis.call('HGET', KEYS[1], 'open_step') or '0')
local step = tonumber(ARGV[2])
if step == open then return {'same', '', tostring(open)} end
if step < open then return {'behind', '', tostring(open)} end
if step - open > tonumber(ARGV[3]) then return {'ahead', '', tostring(open)} end
local id = redis.call('XADD', KEYS[2], '*', 'k', 'a', 's', ARGV[2])
redis.call('HSET', KEYS[1], 'open_step', ARGV[2])
return {'ok', id, ARGV[2]}
"""

# KEYS: 1 spec, 2 meta.  ARGV: 1 spec JSON, 2 uid, 3 spec fingerprint (JSON of the user-visible fields).
# Returns {'created'|'exists'|'conflict', stored spec JSON}.
_CREATE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, decoded = pcall(cjson.decode, cur)
  if ok and decoded['fingerprint'] == ARGV[3] then return {'exists', cur} end
  return {'conflict', cur}
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'uid', ARGV[2], 'open_step', '0')
return {'created', ARGV[1]}
"""

# KEYS: 1 meta, 2 log.  ARGV: 1 uid, 2 snapshot id, 3 covered log id, 4 chunk count, 5 open step it
# covers, 6 trim (0/1).  Makes a fully written snapshot current and trims the log below what it covers.
# Returns the id of the snapshot it replaced ('' if none) so the caller deletes its chunks; 'gone' when
# the dataset was deleted; 'stale' when a newer snapshot is already current (the caller drops its own).
_COMMIT_SNAPSHOT = """
local function older(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end
local uid = redis.call('HGET', KEYS[1], 'uid')
if uid ~= ARGV[1] then return 'gone' end
local cur = redis.call('HGET', KEYS[1], 'snap_covered')
if cur and not older(cur, ARGV[3]) then return 'stale' end
local old = redis.call('HGET', KEYS[1], 'snap') or ''
redis.call('HSET', KEYS[1], 'snap', ARGV[2], 'snap_covered', ARGV[3], 'snap_chunks', ARGV[4], 'snap_step', ARGV[5])
if ARGV[6] == '1' then
  redis.call('XTRIM', KEYS[2], 'MINID', ARGV[3])
  redis.call('HSET', KEYS[1], 'trim', ARGV[3])
end
return old
"""


# KEYS: 1 spec, 2 meta, 3 log.  ARGV: 1 spec JSON, 2 uid, 3 snapshot id, 4 covered id, 5 chunk count,
# 6 open step.  Creates a dataset whose beliefs start from an imported snapshot (chunks already written).
# Returns 'created' or 'exists' (the name is taken; nothing changed).
_IMPORT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[2], 'uid', ARGV[2], 'open_step', ARGV[6], 'snap', ARGV[3], 'snap_covered', ARGV[4],
           'snap_chunks', ARGV[5], 'snap_step', ARGV[6])
return 'created'
"""


class StoreError(Exception):
    """The store could not be reached or answered out of contract (maps to 503)."""


class DatasetGone(Exception):
    """The dataset was deleted (or deleted and recreated) while a request was in flight (maps to 404)."""


@dataclass(frozen=True)
class WriteResult:
    status: str
    log_id: str
    open_step: int


def parse_id(log_id: str) -> tuple[int, int]:
    """Stream ids compare as (milliseconds, sequence) pairs, not as strings."""
    if not log_id:
        return (0, 0)
    ms, _, seq = log_id.partition("-")
    return (int(ms), int(seq or 0))


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Keys:
    """Builds every key; names are validated here so nothing unvalidated reaches Redis."""

    def __init__(self, prefix: str) -> None:
        self.prefix = f"{prefix}:{LAYOUT}"
        self.registry = f"{self.prefix}:datasets"

    def _base(self, name: str) -> str:
        if not NAME_RE.match(name):
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

    def snap_glob(self, name: str, snap_id: str) -> str:
        return f"{self._base(name)}:snap:{snap_id}:*"

    def snaplock(self, name: str) -> str:
        return f"{self._base(name)}:snaplock"

    def rid_pattern(self, name: str) -> str:
        return f"{self._base(name)}:rid:*"

    def snap_pattern(self, name: str) -> str:
        return f"{self._base(name)}:snap:*"


async def connect(url: str, timeout_s: float) -> aioredis.Redis | RedisCluster:
    """Connects to a standalone server or, when the server runs in cluster mode, to the whole cluster."""
    kwargs = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    probe = aioredis.Redis.from_url(url, **kwargs)
    try:
        info = await probe.info("cluster")
    finally:
        await probe.aclose()
    if info.get("cluster_enabled") in (1, "1"):
        return RedisCluster.from_url(url, **kwargs)
    return aioredis.Redis.from_url(url, health_check_interval=30, **kwargs)


class Store:
    """Async access to the datasets' keys. Raises StoreError when the store is unreachable."""

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
        self._observe = client.register_script(_OBSERVE)
        self._advance = client.register_script(_ADVANCE)
        self._create = client.register_script(_CREATE)
        self._commit = client.register_script(_COMMIT_SNAPSHOT)
        self._import = client.register_script(_IMPORT)

    async def close(self) -> None:
        await self.r.aclose()

    async def ping(self) -> bool:
        return bool(await self.r.ping())

    # ---- datasets -------------------------------------------------------------------------------
    async def create_dataset(self, name: str, spec: dict[str, Any], fingerprint: str) -> tuple[str, dict]:
        uid = uuid.uuid4().hex
        doc = dict(spec, uid=uid, fingerprint=fingerprint)
        status, stored = await self._create(
            keys=[self.keys.spec(name), self.keys.meta(name)], args=[json.dumps(doc), uid, fingerprint]
        )
        await self.r.sadd(self.keys.registry, name)
        return _s(status), json.loads(_s(stored))

    async def import_dataset(
        self,
        name: str,
        spec: dict[str, Any],
        fingerprint: str,
        uid: str,
        covered_id: str,
        open_step: int,
        chunks: list[bytes | memoryview],
    ) -> bool:
        """Creates `name` from snapshot chunks; False (and nothing left behind) when the name is taken."""
        snap_id = uuid.uuid4().hex[:16]
        for i, chunk in enumerate(chunks):
            await self.r.set(self.keys.snap_chunk(name, snap_id, i), chunk)
        doc = dict(spec, uid=uid, fingerprint=fingerprint)
        status = _s(
            await self._import(
                keys=[self.keys.spec(name), self.keys.meta(name), self.keys.log(name)],
                args=[json.dumps(doc), uid, snap_id, covered_id, len(chunks), open_step],
            )
        )
        if status != "created":
            await self._delete_matching(self.keys.snap_glob(name, snap_id))
            return False
        await self.r.sadd(self.keys.registry, name)
        return True

    async def get_spec(self, name: str) -> dict | None:
        raw = await self.r.get(self.keys.spec(name))
        return json.loads(raw) if raw else None

    async def list_datasets(self) -> list[str]:
        names = sorted(_s(n) for n in await self.r.smembers(self.keys.registry))
        return names

    async def delete_dataset(self, name: str) -> bool:
        existed = bool(await self.r.delete(self.keys.spec(name)))
        await self.r.delete(self.keys.meta(name), self.keys.log(name), self.keys.snaplock(name))
        for pattern in (self.keys.snap_pattern(name), self.keys.rid_pattern(name)):
            await self._delete_matching(pattern)
        await self.r.srem(self.keys.registry, name)
        return existed

    async def _delete_matching(self, pattern: str) -> None:
        batch: list[Any] = []
        async for key in self.r.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                await self.r.delete(*batch)
                batch.clear()
        if batch:
            await self.r.delete(*batch)

    # ---- writes ---------------------------------------------------------------------------------
    async def append_observe(
        self, name: str, uid: str, step: int, request_id: str, payload: bytes
    ) -> WriteResult:
        res = await self._observe(
            keys=[self.keys.meta(name), self.keys.log(name), self.keys.rid(name, uid, request_id)],
            args=[uid, step, request_id, payload, self.rid_ttl, self.max_step_gap],
        )
        return WriteResult(_s(res[0]), _s(res[1]), int(_s(res[2])))

    async def advance(self, name: str, uid: str, step: int) -> WriteResult:
        res = await self._advance(
            keys=[self.keys.meta(name), self.keys.log(name)], args=[uid, step, self.max_step_gap]
        )
        return WriteResult(_s(res[0]), _s(res[1]), int(_s(res[2])))

    # ---- reads ----------------------------------------------------------------------------------
    async def read_meta(self, name: str) -> dict[str, str]:
        raw = await self.r.hgetall(self.keys.meta(name))
        return {_s(k): _s(v) for k, v in raw.items()}

    async def sync_point(self, name: str, after_id: str, count: int) -> tuple[dict[str, str], int, list]:
        """One round trip: the meta hash, the log length and the first `count` log entries after `after_id`."""
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.meta(name))
            pipe.xlen(self.keys.log(name))
            pipe.xrange(self.keys.log(name), min=f"({after_id}" if after_id else "-", count=count)
            meta_raw, length, entries = await pipe.execute()
        meta = {_s(k): _s(v) for k, v in meta_raw.items()}
        return meta, int(length), entries

    async def read_log(self, name: str, after_id: str, count: int) -> list:
        return await self.r.xrange(self.keys.log(name), min=f"({after_id}" if after_id else "-", count=count)

    # ---- snapshots ------------------------------------------------------------------------------
    async def try_snapshot_lock(self, name: str, owner: str, ttl_ms: int) -> bool:
        return bool(await self.r.set(self.keys.snaplock(name), owner, nx=True, px=ttl_ms))

    async def release_snapshot_lock(self, name: str, owner: str) -> None:
        cur = await self.r.get(self.keys.snaplock(name))
        if cur is not None and _s(cur) == owner:
            await self.r.delete(self.keys.snaplock(name))

    async def write_snapshot(
        self,
        name: str,
        uid: str,
        covered_id: str,
        open_step: int,
        chunks: AsyncIterable[bytes | memoryview],
        trim: bool = True,
    ) -> bool:
        """Writes the chunks as they arrive (counting them), then switches the dataset to them atomically.

        Chunks are consumed one at a time, so a producer that compresses as it goes never needs the whole
        snapshot in memory. Returns False (and removes what it wrote) when the dataset is gone or a newer
        snapshot won; on an error while writing chunks, removes those written so far and re-raises.
        """
        snap_id = uuid.uuid4().hex[:16]
        count = 0
        try:
            async for chunk in chunks:
                await self.r.set(self.keys.snap_chunk(name, snap_id, count), chunk)
                count += 1
                del chunk  # released before the producer makes the next one
        except BaseException:
            # Nothing refers to these chunks yet. (Not after the commit below: a commit that failed on
            # the client side may still have been applied, and its chunks are then the current snapshot.)
            with contextlib.suppress(RedisError, OSError):
                await self._delete_matching(self.keys.snap_glob(name, snap_id))
            raise
        old = _s(
            await self._commit(
                keys=[self.keys.meta(name), self.keys.log(name)],
                args=[uid, snap_id, covered_id, count, open_step, "1" if trim else "0"],
            )
        )
        if old in ("gone", "stale"):
            await self._delete_matching(self.keys.snap_glob(name, snap_id))
            return False
        if old:
            await self._delete_matching(self.keys.snap_glob(name, old))
        return True

    async def read_snapshot_chunk(self, name: str, snap_id: str, index: int) -> bytes:
        """Chunk `index` of snapshot `snap_id`; StoreError when it is missing (evicted or deleted)."""
        part = await self.r.get(self.keys.snap_chunk(name, snap_id, index))
        if part is None:
            raise StoreError(f"snapshot {snap_id} of dataset {name!r} is missing chunk {index}")
        return part
