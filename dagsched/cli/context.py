"""What the root command hands to every sub-command: its options, and the settings built once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from dagsched.logging import configure_logging
from dagsched.settings import Settings, load_settings


@dataclass
class CliState:
    """The root options, kept on the click context; builds the settings once per command."""

    profile: str | None = None
    home: Path | None = None
    log_level: str | None = None
    config_dir: Path | None = None
    _settings: Settings | None = field(default=None, repr=False)

    def settings(self, overrides: Mapping[str, Any] | None = None) -> Settings:
        """Load the settings with the root options and `overrides`, then configure logging."""
        if self._settings is None:
            merged: dict[str, Any] = {}
            if self.home is not None:
                merged["home"] = self.home
            if self.log_level is not None:
                merged["log_level"] = self.log_level
            merged.update(overrides or {})
            self._settings = load_settings(self.profile, merged, self.config_dir)
            configure_logging(self._settings.log_level, self._settings.log_json)
        return self._settings


def state(ctx: typer.Context) -> CliState:
    """The `CliState` the root callback stored (a fresh one when a command runs on its own)."""
    obj = ctx.find_object(CliState)
    return obj if obj is not None else ctx.ensure_object(CliState)


def help_without_command(ctx: typer.Context) -> None:
    """For a group called without a sub-command: show its help and exit 2 (a usage error)."""
    if ctx.invoked_subcommand is None and not ctx.resilient_parsing:
        text = ctx.get_help()
        if text:
            typer.echo(text)
        raise typer.Exit(2)
