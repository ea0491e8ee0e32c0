"""The import graph points the way DESIGN.md's parts table says: down.

    schemas <- core <- sim <- (settings) <- policy <- registry <- learner <- daemon <- cli, ...

Serving (`daemon`, `policy`) reads the domain in `core` and never the simulator, but for the
daemon's Kafka adapter of the replay, which runs the simulator.

Every `import` in every module of `dagsched` is read with `ast` (inside functions and
`if TYPE_CHECKING:` blocks too: a deferred or type-only import is still a dependency), and
each test names the edges that break its rule. A deliberate exception that cannot go yet is
listed in `ALLOWED`, with why; an entry that no longer matches any import fails the last test,
so the list only shrinks.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "dagsched"

# Bottom first. A module may import from its own layer and the layers below it.
LAYERS: dict[str, int] = {
    "schemas": 0,
    "core": 1,  # the shared domain: workflows, views, bounds, history, the observation
    "sim": 2,
    # top-level modules that DESIGN.md's table does not list: the typed settings (they embed
    # sim's scenario config), the services' settings, the logging setup, the Redis clients
    "settings": 3,
    "service_config": 3,
    "logging": 3,
    "redis_connect": 3,  # every Redis client (a URL or Sentinel): serving and learning use it
    "policy": 4,
    "registry": 5,
    "learner": 6,
    "daemon": 7,
    # presentation and wiring: the command line, the demo story, tables and charts
    "cli": 8,
    "demo": 8,
    "reporting": 8,
}
PRESENTATION = {"cli", "demo", "reporting"}
# Parts that serve decisions: they read the domain (`core`), never the simulator.
SERVING = {"policy", "daemon", "registry"}
# Third-party roots that sim (pure numpy: the world, no I/O) must not import.
NOT_IN_SIM = {
    "asyncio",
    "aiokafka",
    "kafka",
    "redis",
    "mlflow",
    "torch",
    "torch_geometric",
    "captum",
    "sklearn",
}
# Drawing and terminal output: presentation only.
PRESENTATION_LIBS = {"matplotlib", "rich", "typer", "click", "tqdm"}

# (importer, imported module or package): deliberate exceptions, each with its reason.
ALLOWED: dict[tuple[str, str], str] = {
    # DESIGN.md gives the daemon "the Kafka adapter of the replay": `dagsched sim replay`
    # plays the job queue with the simulator itself (engine, runner, workload generator).
    ("dagsched.daemon.replay", "dagsched.sim"): "the replay runs the simulator",
}


def _covers(entry: tuple[str, str], src: str, dst: str) -> bool:
    a, b = entry
    return src == a and (dst == b or dst.startswith(b + "."))


def allowed(src: str, dst: str) -> bool:
    """Whether `src -> dst` is one of the `ALLOWED` exceptions."""
    return any(_covers(entry, src, dst) for entry in ALLOWED)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (REPO / rel).with_suffix(".py").is_file() or (REPO / rel / "__init__.py").is_file()


@cache
def imports() -> dict[str, set[str]]:
    """Module -> every module name it imports (`from pkg import mod` resolved to `pkg.mod`)."""
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - node.level + 1]
                    base = ".".join([*pkg, base] if base else pkg)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if _is_module(sub) else base)
        out[name] = found
    return out


def part(module: str) -> str:
    """`dagsched.core.view` -> `core`; `dagsched.settings` -> `settings`."""
    return module.split(".")[1]


def internal_edges() -> list[tuple[str, str]]:
    """(importer, imported) for every import of one dagsched module by another."""
    return [
        (src, dst)
        for src, dsts in imports().items()
        for dst in sorted(dsts)
        if dst.startswith("dagsched.") and src != "dagsched"
    ]


def external(module: str) -> set[str]:
    """Top-level names of what `module` imports from outside dagsched."""
    return {d.split(".")[0] for d in imports()[module] if not d.startswith("dagsched")}


def _broken(edges: list[tuple[str, str]]) -> list[str]:
    return [f"{a} -> {b}" for a, b in edges if not allowed(a, b)]


def test_every_module_is_in_a_layer() -> None:
    unknown = sorted({part(m) for m in imports() if m != "dagsched"} - set(LAYERS))
    assert not unknown, f"add {unknown} to LAYERS here (and to README's layout section)"


def test_imports_point_down() -> None:
    up = [
        (a, b)
        for a, b in internal_edges()
        if part(b) in LAYERS and LAYERS[part(b)] > LAYERS.get(part(a), 99)
    ]
    assert not _broken(up), "imports that point up the layers:\n" + "\n".join(_broken(up))


def test_only_cli_and_demo_import_daemon() -> None:
    bad = [
        (a, b)
        for a, b in internal_edges()
        if part(b) == "daemon" and part(a) not in ("daemon", "cli", "demo")
    ]
    assert not _broken(bad), "\n".join(_broken(bad))


def test_serving_never_imports_the_simulator() -> None:
    bad = [(a, b) for a, b in internal_edges() if part(a) in SERVING and part(b) == "sim"]
    assert not _broken(bad), "\n".join(_broken(bad))


def test_sim_core_and_schemas_stay_light() -> None:
    """sim and core: no torch, asyncio, Kafka, Redis or MLflow; schemas: pydantic, stdlib."""
    bad = []
    for module in imports():
        if module.startswith(("dagsched.sim", "dagsched.core")):
            bad += [f"{module} -> {x}" for x in sorted(external(module) & NOT_IN_SIM)]
        if module.startswith("dagsched.schemas"):
            other = external(module) - set(sys.stdlib_module_names) - {"pydantic"}
            bad += [f"{module} -> {x}" for x in sorted(other)]
    assert not bad, "\n".join(bad)


def test_presentation_libraries_only_in_cli_demo_and_reporting() -> None:
    bad = [
        f"{module} -> {lib}"
        for module in imports()
        if module != "dagsched" and part(module) not in PRESENTATION
        for lib in sorted(external(module) & PRESENTATION_LIBS)
    ]
    assert not bad, "drawing or terminal output below the CLI:\n" + "\n".join(bad)


def test_the_allow_list_has_no_stale_entry() -> None:
    edges = internal_edges()
    stale = [f"{a} -> {b}" for a, b in ALLOWED if not any(_covers((a, b), *e) for e in edges)]
    assert not stale, "remove from ALLOWED (the import is gone):\n" + "\n".join(stale)
