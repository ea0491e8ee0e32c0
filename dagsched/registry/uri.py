"""Resolve what a user names a model by: an alias, a version, an MLflow models: URI, a folder."""

from __future__ import annotations

import re
from pathlib import Path

from dagsched.policy.scheduler import GNNScheduler
from dagsched.registry.errors import RegistryError
from dagsched.registry.store import CHAMPION, Registry

_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[\w-]+)|/(?P<version>\d+))$")


def load_model(registry: Registry, uri: str | None) -> tuple[str, GNNScheduler]:
    """(display name, scheduler). None or "champion" -> the champion (the shipped one is
    registered first on an empty registry); "3" or "models:/NAME/3" -> version 3;
    "models:/NAME@alias" -> that alias; an existing folder -> a model bundle on disk."""
    from dagsched.policy.bundle import BundleError, load_bundle

    if uri is None or uri == CHAMPION:
        registry.ensure_champion()
        version = registry.alias_version(CHAMPION)
        if version is None:
            raise RegistryError("no champion registered and no shipped champion to register")
        return CHAMPION, registry.load(version)
    if uri.isdigit():
        return uri, registry.load(uri)
    m = _MODELS_URI.match(uri)
    if m:
        if m["name"] != registry.name:
            raise RegistryError(
                f"unknown registered model {m['name']!r} (this is {registry.name!r})"
            )
        if m["version"]:
            return uri, registry.load(m["version"])
        version = registry.alias_version(m["alias"])
        if version is None:
            raise RegistryError(f"no version has the alias {m['alias']!r}")
        return uri, registry.load(version)
    path = Path(uri)
    if path.is_dir():
        try:
            return uri, load_bundle(path, f"bundle:{path.name}")
        except BundleError as exc:
            raise RegistryError(str(exc)) from None
    raise RegistryError(f"cannot resolve model {uri!r}: not a version, alias URI or bundle folder")
