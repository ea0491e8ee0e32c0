"""Loading servable schedulers from the registry by alias (the daemon's only entry point).

Placeholder until the policy/registry issue lands: no model is ever registered, so every
caller serves its heuristic fallback. The signatures are the contract.
"""

from __future__ import annotations

from dagsched.policy.api import Scheduler
from dagsched.settings import Settings

MODEL_CHANNEL = "dagsched:models"  # Redis pub/sub channel (prefixed by topic_prefix)


def model_channel(settings: Settings) -> str:
    """The Redis channel on which promotions and rollbacks are announced."""
    return settings.topic_prefix + MODEL_CHANNEL


def alias_version(settings: Settings, alias: str) -> str | None:
    """The registry version that `alias` ("champion", "challenger") points at, or None.

    Raises `RegistryError` only when the registry itself is unreachable.
    """
    return None


def load_alias(settings: Settings, alias: str) -> tuple[str, Scheduler] | None:
    """The scheduler behind `alias`, verified (checksums + smoke inference), or None when no
    version carries the alias. Raises `RegistryError` when the version is refused."""
    return None
