"""Per-family history in Redis: the daemon's copy of `core.history`, fed by the same events.

One hash per family, `{prefix}dagsched:hist:{family}`:

| field | holds |
|---|---|
| `count`, `ooms` | finished attempts observed; OOM kills observed |
| `last_oom_s`, `oom_limit` | when the last OOM kill was; the highest memory ratio one hit |
| `rt1`, `rt2`, `nrt` | the last two runtime ratios (rt2 newest) and how many there are |
| `ref` | the reference time of the decaying weights (the first sample's time) |
| `c:{i}`, `m:{i}`, `r:{i}` | weight of bucket i of the CPU use, memory peak and runtime ratios |
| `ctot`, `mtot`, `rtot` | total weight of each histogram |

The ratios and buckets are computed here (`sample_args`) with `core.history`'s functions, from
what the task declared as kept with its reservation (`Declared`), never from the workflow; the
updater's event script adds them atomically with the release of that reservation, so replicas
of the updater can share a family and a redelivered end event (its reservation gone) counts
nothing. `stats` reads the hashes back into `FamilyStats`, so a policy reads the same numbers
as in the simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from dagsched.core.history import (
    HALF_LIFE_S,
    N_BUCKETS,
    RESCALE_AT,
    FamilyStats,
    bucket,
    measured_ratios,
)
from dagsched.schemas.messages import TaskFailedMsg, TaskFinishedMsg

# Measured samples into families' hashes, as Lua functions the event script calls
# (`redis_scripts.APPLY_EVENTS_LUA`) for an attempt whose reservation it releases in the same
# atomic step: the reservation goes with it, so a redelivered end event finds none and counts
# nothing. A batch reads each family's hash once (`hist_of`), adds its samples in order, and
# writes the changed fields back once (`hist_flush`); numbers are written with 17 significant
# digits, which read back as the same doubles, so a batch gives what its events one by one
# give. `record_sample` arguments: the family's cache, kind (done|oom), at, cpu bucket, mem
# bucket, runtime bucket, runtime ratio, oom limit ratio, half-life, rescale threshold.
RECORD_FN = """
local hists = {}
local function hist_of(key)
  local c = hists[key]
  if not c then
    local all = redis.call('HGETALL', key)
    c = {key = key, f = {}, dirty = {}}
    for i = 1, #all, 2 do c.f[all[i]] = all[i + 1] end
    hists[#hists + 1] = c
    hists[key] = c
  end
  return c
end
local function hset(c, k, v)
  c.f[k] = v
  c.dirty[k] = true
end
local function hadd(c, k, x)
  hset(c, k, string.format('%.17g', (tonumber(c.f[k]) or 0) + x))
end
local function record_sample(c, kind, at_s, cb, mb, rb, rt, lim, half, rescale)
  if kind == 'oom' then
    hset(c, 'ooms', string.format('%d', (tonumber(c.f['ooms']) or 0) + 1))
    hset(c, 'last_oom_s', at_s)
    if tonumber(lim) > (tonumber(c.f['oom_limit']) or 0) then hset(c, 'oom_limit', lim) end
    return
  end
  local at = tonumber(at_s)
  local ref = tonumber(c.f['ref'])
  if not ref then
    hset(c, 'ref', at_s)
    ref = at
  end
  local w = 2 ^ ((at - ref) / tonumber(half))
  if w > tonumber(rescale) then
    for f, v in pairs(c.f) do
      if string.match(f, '^[cmr]:') or string.match(f, '^[cmr]tot$') then
        hset(c, f, string.format('%.17g', tonumber(v) / w))
      end
    end
    hset(c, 'ref', at_s)
    w = 1
  end
  w = tonumber(tostring(w))
  hadd(c, 'c:' .. cb, w)
  hadd(c, 'm:' .. mb, w)
  hadd(c, 'r:' .. rb, w)
  hadd(c, 'ctot', w)
  hadd(c, 'mtot', w)
  hadd(c, 'rtot', w)
  hset(c, 'count', string.format('%d', (tonumber(c.f['count']) or 0) + 1))
  local n = tonumber(c.f['nrt']) or 0
  if n >= 1 then hset(c, 'rt1', c.f['rt2']) end
  hset(c, 'rt2', rt)
  hset(c, 'nrt', string.format('%d', math.min(n + 1, 2)))
end
local function hist_flush()
  for _, c in ipairs(hists) do
    local args = {}
    for k in pairs(c.dirty) do
      args[#args + 1] = k
      args[#args + 1] = c.f[k]
    end
    if #args > 0 then redis.call('HSET', c.key, unpack(args)) end
  end
end
"""
HISTORY_ARGS = (repr(HALF_LIFE_S), repr(RESCALE_AT))  # the function's last two arguments


@dataclass(frozen=True, slots=True)
class Declared:
    """What a task declared, kept with its reservation so that the updater learns from the
    attempt's end without reading the workflow: its family, type and requests (and its cold
    start, which says when its compute begins once it starts)."""

    family: str
    type: str  # a `TASK_TYPE_NAMES` name
    cpu_cores: float
    mem_gb: float
    duration_s: float
    cold_start_s: float = 0.0


def sample_args(
    msg: TaskFinishedMsg | TaskFailedMsg,
    declared: Declared,
    node_kind: str,
    speed: dict[str, dict[str, float]],
) -> list[str] | None:
    """`record_sample`'s arguments after the key (kind .. oom limit) for one attempt's end
    event, computed with `core.history`'s functions; None when it tells nothing (a failure
    other than an OOM kill)."""
    if isinstance(msg, TaskFailedMsg):
        if msg.reason != "oom":
            return None
        return ["oom", repr(msg.at), "0", "0", "0", "0", repr(msg.peak_mem_gb / declared.mem_gb)]
    m = measured_ratios(
        declared.duration_s,
        declared.cpu_cores,
        declared.mem_gb,
        speed.get(node_kind, {}).get(declared.type, 1.0),
        msg.runtime_s,
        msg.cpu_core_s,
        msg.peak_mem_gb,
    )
    return ["done", repr(msg.at), str(bucket(m.cpu)), str(bucket(m.mem)), str(bucket(m.runtime)),
            repr(m.runtime), "0"]  # fmt: skip


# Every family's hash in one reply: a line per family (ARGV after the key prefix), its fields
# and values separated by tabs (both are names and numbers this module writes).
STATS_LUA = r"""
local out = {}
for i = 2, #ARGV do
  out[#out + 1] = table.concat(redis.call('HGETALL', ARGV[1] .. ARGV[i]), '\t')
end
return table.concat(out, '\n')
"""


class RedisHistory:
    """Decaying per-family statistics of measured outcomes, kept in Redis."""

    def __init__(
        self,
        redis: aioredis.Redis,
        key: Callable[..., str],
        speed: dict[str, dict[str, float]],
    ) -> None:
        self.redis = redis
        self.key = key
        self.speed = speed
        self._stats = redis.register_script(STATS_LUA)

    async def stats(self, families: Sequence[str], client: Any = None) -> dict[str, FamilyStats]:
        """What history knows of each of `families` (absent: never observed), in one script
        call and one reply string (a pipeline of HGETALLs was a reply per field to parse).
        With a pipeline as `client` the call is only queued: parse its reply with
        `parse_stats`."""
        if not families:
            return {}
        text = await self._stats(args=[self.key("hist", ""), *families], client=client)
        return {} if client is not None else parse_stats(families, text)


def parse_stats(families: Sequence[str], text: bytes | str) -> dict[str, FamilyStats]:
    """The stats script's reply, by family."""
    lines = (text.decode() if isinstance(text, bytes) else text).split("\n")
    out = {}
    for f, line in zip(families, lines, strict=True):
        if (stats := stats_of_row(line)) is not None:
            out[f] = stats
    return out


def stats_of_row(row: str) -> FamilyStats | None:
    """One family's hash as the scripts reply it (fields and values, tab-separated), or None
    when it is empty (never observed)."""
    if not row:
        return None
    parts = row.split("\t")
    return _family_stats(dict(zip(parts[::2], parts[1::2], strict=True)))


def _family_stats(h: dict[str, str]) -> FamilyStats:
    s = FamilyStats(
        count=int(h.get("count", 0)),
        ooms=int(h.get("ooms", 0)),
        last_oom_s=float(h.get("last_oom_s", "-inf")),
        oom_limit=float(h.get("oom_limit", 0.0)),
    )
    n = int(h.get("nrt", 0))
    s.last_runtimes = tuple(float(h[k]) for k in ("rt1", "rt2")[2 - n :])
    ref = float(h["ref"]) if "ref" in h else None
    for name, hist in (("c", s.cpu), ("m", s.mem), ("r", s.runtime)):
        hist.ref_s = ref
        hist.total = float(h.get(f"{name}tot", 0.0))
        w = np.zeros(N_BUCKETS)
        prefix = f"{name}:"
        for k, v in h.items():
            if k.startswith(prefix):
                w[int(k[2:])] = float(v)
        hist.weights = w
    return s
