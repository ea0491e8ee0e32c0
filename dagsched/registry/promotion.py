"""Promotion and rollback: one move of the `champion` alias, an audit record, then a notice.

Order matters. The candidate is loaded and verified first (checksums + smoke inference); a
version that fails is refused before any alias moves, so the champion keeps serving. Then
`previous` is pointed at the old champion, and `champion` at the new one: that single alias
move is the switch every daemon sees. A promotion with a holdback also points `holdback` at
the old champion, which then serves the daemons' holdback slice until the guardrail clears
the new one (`clear`) or rolls it back. The audit record (who or what, when, why, the
statistics) is an MLflow run in the `<experiment>-audit` experiment, tagged on the version too.
Last, a JSON notice on the Redis channel `model_channel(settings)` makes daemons reload now
(they also poll, so a lost notice only delays the switch by `daemon.reload_poll_s`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import structlog

from dagsched.registry.errors import RegistryError
from dagsched.registry.serving import model_channel
from dagsched.registry.store import CHALLENGER, CHAMPION, HOLDBACK, PREVIOUS, SHADOW, Registry
from dagsched.settings import Settings

log = structlog.get_logger(__name__)

Notify = Callable[[str], None]
AUDIT_SUFFIX = "-audit"


def redis_notifier(settings: Settings, channel: str) -> Notify:
    """Publish a notice on `channel` (best effort: daemons poll as well)."""

    def publish(message: str) -> None:
        import redis

        from dagsched.redis_connect import sync_client

        client = sync_client(settings, connect_timeout_s=2, timeout_s=2)
        try:
            client.publish(channel, message)
        except redis.RedisError as exc:
            log.warning("model.notice_failed", error=str(exc))
        finally:
            client.close()

    return publish


class Promoter:
    """Moves aliases with checks, records an audit trail, and announces the change."""

    def __init__(self, registry: Registry, notify: Notify | None = None) -> None:
        self.registry = registry
        s = registry.settings
        self.notify = notify or redis_notifier(s, model_channel(s))

    def promote(
        self,
        version: str,
        reason: str,
        actor: str,
        stats: dict[str, Any] | None = None,
        holdback: bool = False,
    ) -> dict[str, Any]:
        """Make `version` the champion; RegistryError (nothing moves) if it fails its checks.
        With `holdback` the old champion keeps serving the holdback slice (any earlier
        holdback ends either way)."""
        reg = self.registry
        old = reg.alias_version(CHAMPION)
        if old == version:
            raise RegistryError(f"version {version} is already the champion")
        reg.load(version)  # raises RegistryError: refused, nothing moves
        if old is not None:
            reg.set_alias(PREVIOUS, old)
        if holdback and old is not None:
            reg.set_alias(HOLDBACK, old)  # before the switch: no minute without a baseline
        else:
            reg.delete_alias(HOLDBACK)
        reg.set_alias(CHAMPION, version)  # the switch
        if reg.alias_version(CHALLENGER) == version:
            reg.client.delete_registered_model_alias(reg.name, CHALLENGER)
        return self._record("promote", version, old, reason, actor, stats)

    def rollback(
        self, reason: str, actor: str, stats: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Give the champion alias back to `previous`; RegistryError when there is none or
        it fails its checks."""
        reg = self.registry
        prev = reg.alias_version(PREVIOUS)
        if prev is None:
            raise RegistryError("no previous champion to roll back to")
        old = reg.alias_version(CHAMPION)
        reg.load(prev)
        reg.set_alias(CHAMPION, prev)  # the switch
        reg.client.delete_registered_model_alias(reg.name, PREVIOUS)
        reg.delete_alias(HOLDBACK)  # it served the version that now serves everything
        if old is not None:
            reg.client.set_model_version_tag(reg.name, old, "rolled_back", "true")
        return self._record("rollback", prev, old, reason, actor, stats)

    def clear(self, version: str, reason: str, actor: str, stats: dict[str, Any]) -> None:
        """The guardrail found champion `version` no worse than the one it replaced: the
        holdback slice ends (its workflows go to the champion) and why is recorded."""
        reg = self.registry
        held = reg.alias_version(HOLDBACK)
        reg.delete_alias(HOLDBACK)
        self._record("clear", version, held, reason, actor, stats)

    def retire(self, version: str, reason: str, actor: str, stats: dict[str, Any]) -> None:
        """Take the challenger alias off `version` and record why."""
        reg = self.registry
        if reg.alias_version(CHALLENGER) == version:
            reg.client.delete_registered_model_alias(reg.name, CHALLENGER)
        self._record("retire", version, reg.alias_version(CHAMPION), reason, actor, stats)

    def shadow_to_challenger(self, lineage: str, actor: str) -> str | None:
        """After a test ended (promote or retire): the `shadow` (`learner.keep_learning`)
        becomes the next `challenger` and the shadow alias is removed; returns its version,
        or None when there is no shadow.

        `lineage` is the champion the ended test ran under. A shadow fine-tuned from it is
        tested next; when that champion was just replaced (a promotion), the shadow's
        `parent` tag is moved onto the new champion (the old one is kept in
        `reparented_from`), as the simulator's loop re-parents it, so the learner resumes
        from it and the daemons serve it. A shadow of another lineage (the champion changed
        by hand or by a rollback since it was made) is dropped, not tested. The challenger
        alias moves before the shadow's is removed, so a learner never sees neither."""
        reg = self.registry
        shadow = reg.alias_version(SHADOW)
        if shadow is None:
            return None
        parent = reg.parent_of(shadow)
        champion = reg.alias_version(CHAMPION)
        if parent != lineage or shadow == champion:
            reg.delete_alias(SHADOW)
            log.warning("model.shadow_dropped", version=shadow, parent=parent, lineage=lineage)
            return None
        if champion is not None and champion != parent:
            reg.client.set_model_version_tag(reg.name, shadow, "parent", champion)
            reg.client.set_model_version_tag(reg.name, shadow, "reparented_from", parent or "")
        reg.set_alias(CHALLENGER, shadow)
        reg.delete_alias(SHADOW)
        self._record("challenger", shadow, champion, "the latest shadow", actor, None)
        return shadow

    def _record(
        self,
        action: str,
        version: str,
        old: str | None,
        reason: str,
        actor: str,
        stats: dict[str, Any] | None,
    ) -> dict[str, Any]:
        reg = self.registry
        record = {
            "action": action,
            "version": version,
            "from_version": old or "",
            "reason": reason,
            "actor": actor,
            "at": time.time(),
            "stats": stats or {},
        }
        try:
            run = reg.client.create_run(audit_experiment(reg), run_name=f"{action} v{version}")
            rid = run.info.run_id
            for k in ("action", "version", "from_version", "reason", "actor"):
                reg.client.set_tag(rid, f"audit.{k}", str(record[k])[:4000])
            reg.client.set_tag(rid, "audit.at", f"{record['at']:.3f}")
            reg.client.log_dict(rid, record, "audit.json")
            reg.client.set_terminated(rid, "FINISHED")
            reg.client.set_model_version_tag(
                reg.name, version, f"audit.{action}", json.dumps(record, default=str)[:4000]
            )
        except Exception as exc:  # the alias moved: say so loudly, do not undo it
            log.error("audit.write_failed", action=action, version=version, error=str(exc))
        log.info("model." + action, version=version, previous=old, actor=actor, reason=reason)
        if action != "retire":  # a new champion, or challenger: reload now
            self.notify(json.dumps({"action": action, "version": version, "from": old}))
        return record


def audit_experiment(reg: Registry) -> str:
    """The id of the experiment that holds audit records (created on first use)."""
    name = reg.settings.registry.experiment + AUDIT_SUFFIX
    exp = reg.client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    location = None if reg.settings.mlflow_tracking_uri else (reg.home / "mlartifacts").as_uri()
    return str(reg.client.create_experiment(name, artifact_location=location))


def audit_trail(reg: Registry, version: str | None = None) -> list[dict[str, Any]]:
    """Audit records, oldest first (only those naming `version` when given)."""
    exp = reg.client.get_experiment_by_name(reg.settings.registry.experiment + AUDIT_SUFFIX)
    if exp is None:
        return []
    runs = reg.client.search_runs([exp.experiment_id], max_results=10_000)
    out = []
    for r in runs:
        t = r.data.tags
        rec: dict[str, Any] = {
            k: t.get(f"audit.{k}", "")
            for k in ("action", "version", "from_version", "reason", "actor")
        }
        rec["at"] = float(t.get("audit.at", "0") or 0)
        rec["run_id"] = r.info.run_id
        if version is None or version in (rec["version"], rec["from_version"]):
            out.append(rec)
    return sorted(out, key=lambda r: r["at"])
