"""Where a benchmark's JSON goes, stamped with what it measured and when.

`write_results(path, doc)` adds `commit` (the checked-out commit, `+dirty` when tracked files
differ from it) and `date` (UTC, ISO 8601) to the top-level object and writes it. The docs'
results pages (`tools/results_pages.py`) print both beside every table; a JSON without them
is dated by the git log of its file instead.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _git(*argv: str) -> str:
    try:
        done = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def current_commit() -> str:
    """The checked-out commit, with `+dirty` when a tracked file differs from it; "" off git."""
    sha = _git("rev-parse", "HEAD")
    if not sha:
        return ""
    dirty = any(ln[:2] != "??" for ln in _git("status", "--porcelain").splitlines())
    return sha + ("+dirty" if dirty else "")


def stamp(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with `commit` and `date` set (a copy; an existing `commit` or `date` is kept)."""
    now = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return {"commit": current_commit(), "date": now, **doc}


def write_results(path: Path, doc: dict[str, Any], **dump: Any) -> dict[str, Any]:
    """Write `doc`, stamped, as JSON to `path` (folders made); returns what was written.

    `dump` goes to `json.dumps` (default `indent=2`)."""
    out = stamp(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, **{"indent": 2, **dump}) + "\n")
    return out
