"""MkDocs hook (mkdocs.yml `hooks:`): the generated pages are written before every build.

The results pages (`tools/results_pages.py`, from bench/results/*.json) and the CLI reference
(`tools/cli_reference.py`, from the Typer app) are generated, never typed, and not committed,
so `mkdocs build --strict` (which `make test` runs) always checks the current ones.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cli_reference
import results_pages


def on_pre_build(config: Any, **kwargs: Any) -> None:
    """Write the generated pages (only those whose text changed, so `mkdocs serve` settles)."""
    results_pages.generate()
    cli_reference.generate()
