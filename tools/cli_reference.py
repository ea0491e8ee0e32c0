"""The CLI reference page, generated from the `dagsched` Typer app itself.

Walks the command tree (`typer.main.get_command`) and writes `docs/reference/cli.md`: per
command its help text, its arguments and its options with their defaults, so the page says
what `dagsched COMMAND --help` says. Run by the docs' mkdocs hook before every build; the page
is not committed.

    python tools/cli_reference.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "reference" / "cli.md"

INTRO = """# Command line

Generated from the `dagsched` command itself (`tools/cli_reference.py`): every command and
group also has `--help`. Global options come before the command:
`dagsched [--profile NAME] [--home DIR] [--log-level L] [--config-dir DIR] COMMAND ...`.

Logs go to stderr through structlog (JSON when stderr is not a terminal); stdout carries only
command output. A bad flag or an unreadable input prints one line, `error: ...`, and exits 2.
Settings that a command does not take as a flag are read from the
[settings](settings.md) layers.
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(param: Any) -> str:
    default = getattr(param, "default", None)
    if getattr(param, "is_flag", False) and getattr(param, "secondary_opts", None):
        return f"`{param.opts[0] if default else param.secondary_opts[0]}`"
    if default is None or default == "" or (getattr(param, "is_flag", False) and not default):
        return ""
    return f"`{default}`"


def _params(command: Any) -> list[str]:
    args = [p for p in command.params if p.param_type_name == "argument"]
    opts = [p for p in command.params if p.param_type_name == "option" and not p.hidden]
    out = []
    if args:
        out += ["| argument | required | help |", "|---|---|---|"]
        out += [
            f"| `{p.name.upper()}` | {'yes' if p.required else 'no'} | "
            f"{_cell(getattr(p, 'help', None) or '')} |"
            for p in args
        ]
        out.append("")
    if opts:
        out += ["| option | default | help |", "|---|---|---|"]
        for p in opts:
            names = " / ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
            req = " (required)" if p.required else ""
            out.append(f"| {names} | {_default(p)} | {_cell(p.help or '')}{req} |")
        out.append("")
    return out


def _usage(path: list[str], command: Any) -> str:
    pieces = ["dagsched", *path]
    if any(p.param_type_name == "option" for p in command.params):
        pieces.append("[OPTIONS]")
    pieces += [
        p.name.upper() + ("" if p.required else "?")
        for p in command.params
        if p.param_type_name == "argument"
    ]
    if hasattr(command, "commands"):
        pieces.append("COMMAND")
    return " ".join(pieces)


def _walk(path: list[str], command: Any, depth: int) -> list[str]:
    out = [f"{'#' * depth} `dagsched {' '.join(path)}`", ""]
    help_text = (command.help or "").strip()
    if help_text:
        out += [help_text, ""]
    out += ["```text", _usage(path, command), "```", "", *_params(command)]
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            out += _walk([*path, name], sub, min(depth + 1, 4))
    return out


def render() -> str:
    """The page's Markdown."""
    sys.path.insert(0, str(REPO))
    import typer

    from dagsched.cli.main import app

    root = typer.main.get_command(app)
    out = [INTRO, "## Global options", "", *_params(root)]
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        if not command.hidden:
            out += _walk([name], command, 2)
    return "\n".join(out).rstrip() + "\n"


def generate() -> bool:
    """Write the page unless it already holds the same text; True when it changed."""
    text = render()
    if PAGE.is_file() and PAGE.read_text() == text:
        return False
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    return True


if __name__ == "__main__":
    print(f"{'wrote' if generate() else 'unchanged'} {PAGE.relative_to(REPO)}")
