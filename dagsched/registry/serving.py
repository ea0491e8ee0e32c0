"""Loading servable schedulers from the registry by alias (the daemon's entry point)."""

from __future__ import annotations

from dagsched.core.scheduler import Scheduler
from dagsched.registry.errors import RegistryError
from dagsched.settings import Settings

MODEL_CHANNEL = "dagsched:models"  # Redis pub/sub channel (prefixed by topic_prefix)


def model_channel(settings: Settings) -> str:
    """The Redis channel on which promotions and rollbacks are announced."""
    return settings.topic_prefix + MODEL_CHANNEL


def alias_version(settings: Settings, alias: str) -> str | None:
    """The version `alias` ("champion", "challenger") points at, named as decisions name it
    ("v3", the same name `load_alias` returns), or None.

    When nothing is registered yet the shipped champion is registered first. Raises
    `RegistryError` when the registry itself is unreachable.
    """
    from dagsched.registry.store import CHAMPION, Registry

    try:
        reg = Registry(settings)
        version = reg.alias_version(alias)
        if version is None and alias == CHAMPION:  # only then: it searches every version
            version = reg.ensure_champion()
        return None if version is None else f"v{version}"
    except RegistryError:
        raise
    except Exception as exc:  # MLflow raises many kinds when its store is unreachable
        raise RegistryError(f"registry unreachable: {exc}") from exc


def load_alias(settings: Settings, alias: str) -> tuple[str, Scheduler] | None:
    """The scheduler behind `alias`, verified (checksums + smoke inference), or None when no
    version carries the alias. Raises `RegistryError` when the version is refused."""
    from dagsched.registry.store import Registry

    name = alias_version(settings, alias)
    if name is None:
        return None
    return name, Registry(settings).load(name.removeprefix("v"))


def parent_version(settings: Settings, name: str) -> str | None:
    """The `parent` tag of version `name` ("v3"): the champion it was fine-tuned from, named
    the same way ("v1"), or None. MLflow's own errors pass through (an unreachable registry
    is not a refusal of the version)."""
    from dagsched.registry.store import Registry

    parent = Registry(settings).parent_of(name.removeprefix("v"))
    return None if parent is None else f"v{parent}"
