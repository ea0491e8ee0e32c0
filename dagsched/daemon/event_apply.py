"""Applying `dagsched.events` to Redis a batch at a time: two script calls per batch, whatever
its size.

1. For the batch's end events that history learns from (finished, failed by an OOM kill), one
   read-only script returns what each attempt's task declared, as the daemon kept it with the
   reservation when it decided (`history_store.Declared`), and its node's kind. The
   measured ratios and their buckets are computed here, with `core.history`'s functions.
2. One script applies the whole batch in order, atomically (`APPLY_EVENTS_LUA`): heartbeats,
   node resets, ledger moves and releases, workflow progress (refreshing its workflows' keys'
   TTL), the family history (for an end whose ledger entry it releases) and the clock.

Each event is applied exactly as if it were alone (`RedisState.apply_event` is a batch of
one), and a redelivered event changes nothing: an end whose ledger entry is gone releases
nothing and learns nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from dagsched.daemon.history_store import HISTORY_ARGS, Declared, sample_args
from dagsched.daemon.redis_scripts import APPLY_EVENTS_LUA, LEDGER_INFO_LUA
from dagsched.schemas.messages import (
    NodeDownMsg,
    NodeHeartbeatMsg,
    NodeUpMsg,
    TaskFailedMsg,
    TaskFinishedMsg,
    TaskStartedMsg,
)

_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n"}
_UNESCAPES = {"\\\\": "\\", "\\t": "\t", "\\n": "\n"}
_UNESCAPE = re.compile(r"\\[\\tn]")


def escape(text: str) -> str:
    """`text` with no tab or newline (the scripts' separators): backslash escapes."""
    if "\\" in text or "\t" in text or "\n" in text:
        return "".join(_ESCAPES.get(c, c) for c in text)
    return text


def unescape(text: str) -> str:
    """The inverse of `escape`."""
    return _UNESCAPE.sub(lambda m: _UNESCAPES[m.group()], text) if "\\" in text else text


def declared_fields(d: Declared | None) -> str:
    """A decide line's declared fields (family, type, cpu, mem, duration, cold start),
    tab-separated."""
    if d is None:
        return "\t\t\t\t\t"
    return (
        f"{escape(d.family)}\t{d.type}\t{d.cpu_cores!r}\t{d.mem_gb!r}\t{d.duration_s!r}\t"
        f"{d.cold_start_s!r}"
    )


def _learns(msg: Any) -> bool:
    return isinstance(msg, TaskFinishedMsg) or (
        isinstance(msg, TaskFailedMsg) and msg.reason == "oom"
    )


def event_line(msg: Any) -> str:
    """One event as a line of the apply script (without history's fields)."""
    if isinstance(msg, NodeHeartbeatMsg):
        return (
            f"h\t{msg.node}\t{msg.at!r}\t{msg.kind}\t{msg.zone}\t{msg.cores!r}\t{msg.mem_gb!r}\t"
            f"{msg.gpu_mem_gb!r}\t{msg.net_gbps!r}\t{msg.used_cores!r}\t{msg.used_mem_gb!r}\t"
            f"{msg.queue_len}\t{msg.net_in_bytes!r}\t{msg.failure_rate!r}\t{msg.slowdown!r}"
        )
    if isinstance(msg, NodeDownMsg):
        return f"d\t{msg.node}\t{msg.at!r}"
    if isinstance(msg, NodeUpMsg):
        return f"u\t{msg.node}\t{msg.at!r}"
    if isinstance(msg, TaskStartedMsg):
        return f"s\t{msg.workflow_id}\t{msg.task}\t{msg.attempt}\t{msg.node}\t{msg.at!r}"
    if isinstance(msg, TaskFinishedMsg | TaskFailedMsg):
        done = "1" if isinstance(msg, TaskFinishedMsg) else "0"
        return f"e\t{msg.workflow_id}\t{msg.task}\t{msg.attempt}\t{msg.node}\t{done}"
    raise TypeError(f"not an event: {type(msg).__name__}")


class EventApplier:
    """Applies batches of event messages to the keys under `prefix` (`apply`)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        workflow_ttl_s: int,
        speed: dict[str, dict[str, float]],
    ) -> None:
        self.prefix = prefix
        self.workflow_ttl_s = workflow_ttl_s
        self.speed = speed
        self._info = redis.register_script(LEDGER_INFO_LUA)
        self._apply = redis.register_script(APPLY_EVENTS_LUA)

    async def apply(self, msgs: Sequence[Any]) -> None:
        """Apply `msgs` in order (at most two round trips). Raises `TypeError` for a message
        that is not an event (before anything is applied), `RedisError` when Redis is away
        (then nothing of the batch, or all of it, was applied: retrying it is safe)."""
        lines = [event_line(m) for m in msgs]
        if not lines:
            return
        ends = [i for i, m in enumerate(msgs) if _learns(m)]
        families: dict[str, int] = {}
        if ends:
            keys = [f"{msgs[i].workflow_id}/{msgs[i].task}:{msgs[i].attempt}" for i in ends]
            text = await self._info(args=[self.prefix, "\n".join(keys)])
            rows = (text.decode() if isinstance(text, bytes) else text).split("\n")
            for i, row in zip(ends, rows, strict=True):
                if not row:
                    continue  # no reservation to release: nothing to learn either
                fam, ty, cpu, mem, dur, kind = row.split("\t")
                declared = Declared(unescape(fam), ty, float(cpu), float(mem), float(dur))
                args = sample_args(msgs[i], declared, kind, self.speed)
                if args is not None:
                    pos = families.setdefault(declared.family, len(families) + 1)
                    lines[i] += f"\t{pos}\t" + "\t".join(args)
        clock = repr(max(float(m.at) for m in msgs))
        await self._apply(
            args=[self.prefix, self.workflow_ttl_s, *HISTORY_ARGS, clock, "\n".join(lines),
                  *families]
        )  # fmt: skip
