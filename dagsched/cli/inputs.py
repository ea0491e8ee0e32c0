"""Reading user-supplied input files for CLI commands (the simulator itself does no I/O)."""

from __future__ import annotations

import json
from pathlib import Path

from dagsched.core.workflow import Workflow, WorkflowError
from dagsched.schemas.messages import nesting_depth

# WfFormat documents nest 6 levels (workflow.specification.tasks[i].parents[j]) and a little
# more in free-form fields: far more is refused as a document no parser should recurse into
MAX_DEPTH = 64


def wfformat_files(path: Path) -> list[Path]:
    """`path` itself, or the `*.json` files of a directory in name order; OSError if none."""
    if path.is_dir():
        files = sorted(p for p in path.glob("*.json") if p.is_file())
        if not files:
            raise FileNotFoundError(f"no *.json files in directory {path}")
        return files
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    return [path]


def read_json(file: Path) -> object:
    """The decoded JSON document in `file`; a syntax error, or nesting deeper than
    `MAX_DEPTH` (refused before the parser recurses into it), becomes a `WorkflowError` naming
    the file."""
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkflowError(f"{file}: not UTF-8 text ({exc.reason})") from None
    if nesting_depth(raw, MAX_DEPTH) > MAX_DEPTH:
        raise WorkflowError(f"{file}: JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkflowError(
            f"{file}: invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:  # an integer of thousands of digits
        raise WorkflowError(f"{file}: invalid JSON: {str(exc)[:60]}") from None


def load_wfformat_path(path: Path) -> list[Workflow]:
    """Import a WfFormat JSON file, or every `*.json` in a directory, as workflows.

    Raises OSError for missing or unreadable files and `WorkflowError` for invalid content,
    each message naming the file.
    """
    docs = [(file, read_json(file)) for file in wfformat_files(path)]
    # Imported on use: only this command needs the importer, so the CLI starts without it.
    from dagsched.sim.wfformat import parse_wfformat

    workflows: list[Workflow] = []
    for file, doc in docs:
        try:
            workflows.append(parse_wfformat(doc, source=str(file)))
        except WorkflowError as exc:
            if str(file) in str(exc):
                raise
            raise WorkflowError(f"{file}: {exc}") from exc
    return workflows
