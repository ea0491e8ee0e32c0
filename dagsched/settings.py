"""The one typed settings object, layered from YAML profiles, the environment and CLI overrides.

Precedence, lowest to highest: the defaults in code, `configs/default.yaml`,
`configs/<profile>.yaml`, `DAGSCHED_*` environment variables (nested with `__`, e.g.
`DAGSCHED_SIM__FAULTS__NODE_FAILURE_PER_HOUR=0`), then explicit overrides from the CLI. Layers
are deep-merged (mappings merge key by key; lists and scalars replace), then validated once.
Every level forbids unknown keys, every number must be finite, and no layer may nest deeper
than `MAX_DEPTH`; any problem becomes a one-line `SettingsError` naming the key path and the
layer it came from. Nothing here runs at import time: call `load_settings`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from dagsched.schemas.messages import nesting_depth
from dagsched.service_config import (
    DaemonSettings,
    EvaluatorSettings,
    LearnerSettings,
    RegistrySettings,
    TopicSettings,
    TrainSettings,
)
from dagsched.sim.config import ScenarioConfig

ENV_PREFIX = "DAGSCHED_"
ENV_NESTED = "__"
ENV_PROFILE = "DAGSCHED_PROFILE"
ENV_CONFIG_DIR = "DAGSCHED_CONFIG_DIR"

Layer = tuple[str, dict[str, Any]]

# the deepest a layer may nest (the settings themselves nest 4 levels: sim.cluster.groups[0]);
# deeper input is refused before anything recurses into it
MAX_DEPTH = 32
SHOWN_CHARS = 60  # of a bad value, in an error line


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: only true and false. YAML 1.1 also reads
    `yes`, `no`, `on` and `off` as booleans, so a setting named `no` became the key False.
    As values they stay text, which the settings' boolean fields accept."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


class SettingsError(ValueError):
    """Configuration is invalid; the message is one line naming the offending key path."""


class Settings(BaseSettings):
    """Everything configurable, validated once by `load_settings` and passed down from the CLI."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED, extra="forbid", frozen=True
    )

    home: Path = Field(default=Path(".dagsched"), description="state folder (runs, models)")
    profile: str | None = Field(default=None, description="profile overlay that was applied")
    log_level: str = "INFO"
    log_json: bool | None = Field(default=None, description="None: JSON when stderr is no TTY")
    sim: ScenarioConfig = Field(default_factory=ScenarioConfig)
    # endpoints: one setting each, so any real Kafka, Redis or MLflow server is one line away
    kafka_bootstrap: str = Field(default="127.0.0.1:9092", description="HOST:PORT[,HOST:PORT]")
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Redis Sentinel (docs/operations/redis-failover.md): when set, the primary is whichever
    # server the sentinels name for `redis_master_name`; `redis_url` then gives only the
    # database number and password
    redis_sentinels: list[str] = Field(default_factory=list, description="HOST:PORT, ...")
    redis_master_name: str | None = None
    redis_wait_replicas: int = Field(
        default=0, ge=0, le=16, description="replicas that must hold a decision before it is sent"
    )
    redis_wait_timeout_ms: int = Field(default=100, ge=1, le=60_000)
    topic_prefix: str = Field(default="", description="prepended to every topic name")
    mlflow_tracking_uri: str | None = Field(
        default=None, description="None: SQLite store and artifacts under `home`"
    )
    topics: TopicSettings = Field(default_factory=TopicSettings)
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    learner: LearnerSettings = Field(default_factory=LearnerSettings)
    evaluator: EvaluatorSettings = Field(default_factory=EvaluatorSettings)

    def topic(self, name: str) -> str:
        """The full name of topic `name` ("tasks", "decisions", ...) with the prefix."""
        return self.topic_prefix + getattr(self.topics, name)

    @field_validator("redis_sentinels", mode="before")
    @classmethod
    def _sentinel_list(cls, value: Any) -> Any:
        # one variable or flag spells the list as "h1:26379,h2:26379"
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinel_addresses(cls, value: list[str]) -> list[str]:
        for item in value:
            host, sep, port = item.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"a sentinel is HOST:PORT, got {item!r}")
        return value

    @model_validator(mode="after")
    def _sentinel_pair(self) -> Settings:
        if self.redis_sentinels and not self.redis_master_name:
            raise ValueError("redis_master_name: required when redis_sentinels is set")
        if self.redis_master_name and not self.redis_sentinels:
            raise ValueError("redis_sentinels: required when redis_master_name is set")
        return self

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in logging.getLevelNamesMapping():
            raise ValueError(f"unknown log level {shown(value)}")
        return level

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # `load_settings` merges YAML and the environment itself, so that the precedence is
        # explicit and every error can name the layer it came from; the class takes values only.
        return (init_settings,)


def default_config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`$DAGSCHED_CONFIG_DIR`, else the repository's `configs/` next to the `dagsched` package."""
    env = os.environ if environ is None else environ
    if env.get(ENV_CONFIG_DIR):
        return Path(env[ENV_CONFIG_DIR])
    return Path(__file__).resolve().parent.parent / "configs"


def load_settings(
    profile: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    config_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build the settings from every layer (see the module docstring); raise `SettingsError`.

    `profile` defaults to `$DAGSCHED_PROFILE`; `overrides` may be nested or use dotted keys
    (`{"sim.workload.load": 0.5}`); `environ` defaults to `os.environ`.
    """
    env = os.environ if environ is None else environ
    root = config_dir or default_config_dir(env)
    # The repository's configs/ is optional (an installed package runs on the code defaults);
    # a directory somebody named is not.
    if (config_dir is not None or env.get(ENV_CONFIG_DIR)) and not root.is_dir():
        raise SettingsError(f"config directory not found: {root}")
    profile = profile or env.get(ENV_PROFILE) or None

    layers: list[Layer] = []
    default_file = root / "default.yaml"
    if default_file.is_file():
        layers.append((str(default_file), read_yaml(default_file)))
    if profile is not None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", profile):
            raise SettingsError(f"invalid profile name {profile!r}")
        profile_file = root / f"{profile}.yaml"
        if not profile_file.is_file():
            known = sorted(p.stem for p in root.glob("*.yaml") if p.stem != "default")
            raise SettingsError(
                f"unknown profile {profile!r}: no {profile_file} (profiles: {', '.join(known)})"
            )
        layers.append((str(profile_file), read_yaml(profile_file)))
    layers.append(("environment", env_layer(env)))
    cli = expand_dotted(dict(overrides or {}))
    cli["profile"] = profile
    layers.append(("overrides", cli))

    # Start from the code defaults so that a partial mapping (one row of the speed table, say)
    # merges into them whether or not default.yaml spells them out.
    merged: dict[str, Any] = Settings().model_dump()
    for _, data in layers:
        merged = deep_merge(merged, data)
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        raise SettingsError(describe_errors(exc.errors(), layers)) from None
    for loc, value in _numbers(settings.model_dump()):
        if not math.isfinite(value):
            origin = _origin(loc, layers)
            suffix = f" (from {origin})" if origin else ""
            raise SettingsError(f"{format_path(loc)}: must be a finite number, got {value}{suffix}")
    return settings


def _numbers(data: Any) -> list[tuple[list[str | int], float]]:
    """Every float in `data` (nested dicts, lists and tuples), with its key path."""
    out: list[tuple[list[str | int], float]] = []
    stack: list[tuple[list[str | int], Any]] = [([], data)]
    while stack:
        loc, value = stack.pop()
        if isinstance(value, dict):
            stack += [([*loc, k], v) for k, v in value.items()]
        elif isinstance(value, list | tuple):
            stack += [([*loc, i], v) for i, v in enumerate(value)]
        elif isinstance(value, float):
            out.append((loc, value))
    return out


def check_tree(data: Any, where: str) -> None:
    """Raise `SettingsError` if `data` (one layer, as read) nests deeper than `MAX_DEPTH` or has
    a key that is not a string; walked without recursion."""
    stack: list[tuple[list[str | int], Any]] = [([], data)]
    while stack:
        loc, value = stack.pop()
        if len(loc) > MAX_DEPTH:
            raise SettingsError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    inside = f" in {format_path(loc)}" if loc else ""
                    raise SettingsError(
                        f"{where}: setting names must be text, got {shown(k)}{inside}"
                    )
                stack.append(([*loc, k], v))
        elif isinstance(value, list):
            stack += [([*loc, i], v) for i, v in enumerate(value)]


def shown(value: object) -> str:
    """`repr(value)`, cut to `SHOWN_CHARS` characters."""
    return cut(repr(value))


def cut(text: str) -> str:
    """`text` cut to `SHOWN_CHARS` characters."""
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def read_yaml(path: Path) -> dict[str, Any]:
    """One YAML mapping from `path` (an empty file is an empty mapping), checked by
    `check_tree`."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsError(f"{path}: not UTF-8 text ({exc.reason})") from None
    try:
        data = yaml.load(text, Loader=_Yaml12Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise SettingsError(f"{path}{where}: invalid YAML: {problem}") from None
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise SettingsError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of thousands of digits, say
        raise SettingsError(f"{path}: invalid YAML: {cut(str(exc))}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: the top level must be a mapping of settings")
    check_tree(data, str(path))
    return data


def env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    """The nested mapping spelled by `DAGSCHED_*` variables.

    Top-level fields are taken by name (`DAGSCHED_HOME`); anything with `__` is a nested path.
    Unknown names are kept, so validation reports them rather than ignoring a typo
    (`DAGSCHED_REDIS_ULR`); only `DAGSCHED_CONFIG_DIR` is read elsewhere and skipped here.
    Values that look like JSON lists or objects (`[4, 10]`) are decoded; empty values are unset.
    """
    out: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.upper().startswith(ENV_PREFIX) or raw == "":
            continue
        if name.upper() == ENV_CONFIG_DIR:
            continue  # where the YAML layers come from, not a setting
        key = name[len(ENV_PREFIX) :].lower()
        parts = key.split(ENV_NESTED)
        if not all(parts):
            raise SettingsError(f"malformed setting variable {name}")
        value: Any = raw
        if raw.lstrip()[:1] in ("[", "{"):
            if nesting_depth(raw.encode(), MAX_DEPTH) > MAX_DEPTH:
                raise SettingsError(f"{name}: JSON nested deeper than {MAX_DEPTH} levels")
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise SettingsError(f"{name}: invalid JSON value ({exc.msg})") from None
            except ValueError as exc:  # an integer of thousands of digits
                raise SettingsError(f"{name}: invalid JSON value ({cut(str(exc))})") from None
        _set_path(out, parts, value)
    return out


def expand_dotted(values: dict[str, Any]) -> dict[str, Any]:
    """`{"sim.workload.load": 1}` -> `{"sim": {"workload": {"load": 1}}}`, merged with the rest."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        nested: dict[str, Any] = {}
        _set_path(nested, key.split("."), value)
        out = deep_merge(out, nested)
    return out


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """A new mapping: `top` over `base`, recursing into mappings; other values replace."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        if isinstance(below, Mapping) and isinstance(value, Mapping):
            out[key] = deep_merge(below, value)
        else:
            out[key] = value
    return out


def _set_path(target: dict[str, Any], parts: list[str], value: Any) -> None:
    for part in parts[:-1]:
        nxt = target.get(part)
        if not isinstance(nxt, dict):
            nxt = target[part] = {}
        target = nxt
    target[parts[-1]] = value


_FIELD_PREFIX = re.compile(r"^([a-z_][a-z0-9_]*): (.+)$", re.DOTALL)
_UNKNOWN = {"extra_forbidden", "unexpected_keyword_argument"}


def describe_errors(errors: list[ErrorDetails], layers: list[Layer]) -> str:
    """One line for the first validation error (plus a count of the others)."""
    first = describe_error(errors[0], layers)
    return first if len(errors) == 1 else f"{first} (and {len(errors) - 1} more)"


def describe_error(err: ErrorDetails, layers: list[Layer]) -> str:
    """`sim.workload.load: must be in (0, 2] (from configs/test.yaml)` or `unknown setting ...`."""
    loc: list[str | int] = list(err["loc"])
    msg = err["msg"]
    if err["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")
        # the sim dataclasses' __post_init__ names the field: "load: must be in (0, 2]"
        m = _FIELD_PREFIX.match(msg)
        if m:
            loc.append(m.group(1))
            msg = m.group(2)
    path = format_path(loc)
    origin = _origin(loc, layers)
    suffix = f" (from {origin})" if origin else ""
    if err["type"] in _UNKNOWN:
        return f"unknown setting {path}{suffix}"
    if err["type"] == "missing":
        return f"{path}: required setting is missing{suffix}"
    value = err.get("input")
    if err["type"] != "value_error" and isinstance(value, str | int | float | bool):
        msg = f"{msg}, got {shown(value)}"
    return " ".join(f"{path}: {msg}{suffix}".split())


def format_path(loc: list[str | int]) -> str:
    """`["sim", "cluster", "groups", 0, "kind"]` -> `sim.cluster.groups[0].kind`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _origin(loc: list[str | int], layers: list[Layer]) -> str | None:
    """The highest layer that sets `loc` (or its deepest present prefix)."""
    for depth in range(len(loc), 0, -1):
        for name, data in reversed(layers):
            if _has_path(data, loc[:depth]):
                if name == "environment":
                    return ENV_PREFIX + ENV_NESTED.join(str(p) for p in loc[:depth]).upper()
                return name
    return None


def _has_path(data: Any, loc: list[str | int]) -> bool:
    for part in loc:
        in_map = isinstance(data, Mapping) and part in data
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if not (in_map or in_list):
            return False
        data = data[part]
    return True
