"""Pure parser of WfCommons WfFormat instances (an already `json.loads`-ed object) to `Workflow`.

Supported `schemaVersion`s:

* 1.5 and 1.6: `workflow.specification.tasks[]` (id, name, parents, children, inputFiles,
  outputFiles; references by id), `workflow.specification.files[]` (id, sizeInBytes) and the
  optional `workflow.execution.tasks[]` (id, runtimeInSeconds, coreCount, memoryInBytes).
* 1.4 (and 1.3, whose older key names are accepted as fallbacks): `workflow.tasks[]` with name
  (the key other tasks refer to), optional id, category, type (compute/transfer/auxiliary),
  runtimeInSeconds (1.3: runtime), cores, memoryInBytes (1.3: memory, in KB = 1000 bytes),
  parents, children, files[{link: input|output, name, sizeInBytes (1.3: size)}]. A parent or
  child reference is matched against task names first, then against task ids.

Mapping and defaults:

| TaskSpec field | from                                | when missing                          |
| -------------- | ----------------------------------- | ------------------------------------- |
| name           | task name (1.5+: `name:id` unless   | the id (1.5+) / the name (1.4)        |
|                | the name already contains the id)   |                                       |
| duration_s     | runtimeInSeconds                    | 1 s; 0 becomes 0.01 s (MIN_DURATION_S)|
| cpu_cores      | coreCount (1.4: cores)              | 1 core                                |
| mem_gb         | memoryInBytes / 1e9                 | 1 GB (also when 0)                    |
| input_bytes    | sum of the task's input file sizes  | 0 (no files, or no `files` list)      |
| output_bytes   | sum of the task's output file sizes | 0                                     |
| cold_start_s   | (not in WfFormat)                   | 0                                     |
| type           | hint in name/category/type/program  | cpu                                   |

Type hints are read from the words (runs of letters, camelCase split, case-insensitive) of the
task's name, category, 1.4 `type` and command program: a word starting with `gpu`, `cuda` or
`train` gives gpu; a word `io` or one starting with `stage`, `transfer`, `download` or `upload`
gives io; anything else is cpu. The gpu hint wins over the io hint.

The whole document is checked before the workflow is built; any problem raises
`WorkflowError` naming it (and the task where there is one), so nothing is half-imported:
not an object, no `workflow` object, missing or unsupported `schemaVersion`, a task without
name and id, duplicate task ids (names in 1.4), parents or children (or execution entries)
referring to unknown tasks, files not in the `files` list, negative, non-numeric or
non-finite runtimes, cores, memory or sizes, ones past what a workflow message carries
(runtimes over 1e9 s, over 4096 cores, memory or a file over 1e15 bytes), and cycles.
Parents and children lists that disagree are merged (the union of both). Several entries or
exits are kept as they are (no synthetic tasks).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dagsched.core.workflow import TaskSpec, TaskType, Workflow, WorkflowError, family_of

SUPPORTED_VERSIONS: tuple[str, ...] = ("1.3", "1.4", "1.5", "1.6")
DEFAULT_RUNTIME_S = 1.0
MIN_DURATION_S = 0.01
DEFAULT_CORES = 1.0
DEFAULT_MEM_BYTES = 1e9
GB = 1e9
KB = 1000.0
# the largest values a workflow message carries (dagsched.schemas.messages): an imported
# workflow is one the daemon could be sent, and a simulation of it ends
MAX_RUNTIME_S = 1e9
MAX_CORES = 4096.0
MAX_NUMBER = 1e15  # bytes (memory, file sizes)

_GPU_PREFIXES = ("gpu", "cuda", "train")
_IO_PREFIXES = ("stage", "transfer", "download", "upload")


@dataclass
class _Raw:
    """One task as read, before references are resolved."""

    key: str
    name: str
    hints: list[str]
    parents: list[str]
    children: list[str]
    runtime: float | None = None
    cores: float | None = None
    mem_bytes: float | None = None
    input_bytes: float = 0.0
    output_bytes: float = 0.0
    alt_key: str | None = None  # 1.4: the optional id, a fallback reference


def task_type_hint(words: Iterable[str]) -> TaskType:
    """GPU, IO or CPU from the hint words of a task (see the module docstring)."""
    tokens = [t.lower() for w in words for t in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+", w)]
    if any(t.startswith(_GPU_PREFIXES) for t in tokens):
        return TaskType.GPU
    if any(t == "io" or t.startswith(_IO_PREFIXES) for t in tokens):
        return TaskType.IO
    return TaskType.CPU


def parse_wfformat(
    doc: object, source: str, *, wf_id: str | None = None, slack: float = 2.0
) -> Workflow:
    """Build a `Workflow` from a parsed WfFormat instance; raise `WorkflowError` if malformed.

    `source` names where the document came from (it is used in errors and the workflow's
    `source`, as "wfformat:<source>"); the id is `wf_id`, else the instance name, else `source`.
    The deadline is the critical path x `slack`.
    """
    where = f"wfformat {source!r}"
    if not isinstance(doc, dict):
        raise WorkflowError(f"{where}: the document must be a JSON object, got {_kind(doc)}")
    wf = doc.get("workflow")
    if not isinstance(wf, dict):
        raise WorkflowError(f"{where}: missing 'workflow' object")
    version = doc.get("schemaVersion")
    if isinstance(version, int | float) and not isinstance(version, bool):
        version = str(version)
    if version not in SUPPORTED_VERSIONS:
        got = "missing" if version is None else repr(version)
        raise WorkflowError(
            f"{where}: unsupported schemaVersion {got} (supported: {', '.join(SUPPORTED_VERSIONS)})"
        )
    raws = _read_v15(wf, where) if version in ("1.5", "1.6") else _read_v14(wf, where)
    tasks, edges = _resolve(raws, where)
    name = doc.get("name")
    ident = wf_id or (name if isinstance(name, str) and name else source)
    return Workflow.build(ident, tasks, sorted(edges), slack=slack, source=f"wfformat:{source}")


def _shown(value: object) -> str:
    """`repr(value)` cut to 40 characters: an error stays one readable line."""
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _kind(value: object) -> str:
    return type(value).__name__


def _obj(value: object, what: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WorkflowError(f"{where}: {what} must be an object, got {_kind(value)}")
    return value


def _list(value: object, what: str, where: str, *, default_empty: bool = True) -> list[Any]:
    if value is None and default_empty:
        return []
    if not isinstance(value, list):
        raise WorkflowError(f"{where}: {what} must be a list, got {_kind(value)}")
    return value


def _ident(value: object) -> str | None:
    """A task/file reference as a string: non-empty str or int, else None."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _refs(value: object, what: str, where: str) -> list[str]:
    out: list[str] = []
    for ref in _list(value, what, where):
        r = _ident(ref)
        if r is None:
            raise WorkflowError(f"{where}: {what} holds an invalid task reference {_shown(ref)}")
        out.append(r)
    return out


def _num(
    value: object, what: str, where: str, *, positive: bool = False, most: float = MAX_NUMBER
) -> float | None:
    """None when missing; else a finite number >= 0 (> 0 with `positive`) and at most `most`,
    or WorkflowError."""
    if value is None:
        return None
    number = _finite(value)
    if number is None:
        raise WorkflowError(f"{where}: {what} must be a number, got {_shown(value)}")
    if number < 0 or (positive and number == 0):
        raise WorkflowError(f"{where}: {what} must be {'> 0' if positive else '>= 0'}, got {value}")
    if number > most:
        raise WorkflowError(f"{where}: {what} must be at most {most:g}, got {number:g}")
    return number


def _finite(value: object) -> float | None:
    """`value` as a finite float, or None (not a number, not finite, or an int past floats)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _first(d: dict[str, Any], *keys: str) -> object:
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return None


def _read_v15(wf: dict[str, Any], where: str) -> list[_Raw]:
    spec = _obj(wf.get("specification"), "'workflow.specification'", where)
    spec_tasks = _list(spec.get("tasks"), "'specification.tasks'", where, default_empty=False)
    sizes: dict[str, float] | None = None
    if spec.get("files") is not None:
        sizes = {}
        for f in _list(spec.get("files"), "'specification.files'", where):
            fd = _obj(f, "a file entry", where)
            fid = _ident(fd.get("id"))
            if fid is None:
                raise WorkflowError(f"{where}: a file entry has no id")
            size = _num(fd.get("sizeInBytes"), f"file {_shown(fid)} sizeInBytes", where)
            sizes[fid] = size or 0.0
    raws: list[_Raw] = []
    for i, t in enumerate(spec_tasks):
        td = _obj(t, f"task #{i}", where)
        key = _ident(td.get("id")) or _ident(td.get("name"))
        if key is None:
            raise WorkflowError(f"{where}: task #{i} has neither an id nor a name")
        tw = f"{where}, task {_shown(key)}"
        given = td.get("name")
        name = given if isinstance(given, str) and given else key
        raw = _Raw(
            key=key,
            name=name if key in name else f"{name}:{key}",
            hints=[name],
            parents=_refs(td.get("parents"), "parents", tw),
            children=_refs(td.get("children"), "children", tw),
        )
        raw.input_bytes = _file_total(td.get("inputFiles"), sizes, "inputFiles", tw)
        raw.output_bytes = _file_total(td.get("outputFiles"), sizes, "outputFiles", tw)
        raws.append(raw)
    by_key = _unique(raws, where)
    execution = wf.get("execution")
    if execution is not None:
        seen: set[str] = set()
        ex = _obj(execution, "'workflow.execution'", where)
        for i, t in enumerate(_list(ex.get("tasks"), "'execution.tasks'", where)):
            td = _obj(t, f"execution task #{i}", where)
            key = _ident(td.get("id"))
            if key is None:
                raise WorkflowError(f"{where}: execution task #{i} has no id")
            if key not in by_key:
                raise WorkflowError(
                    f"{where}: execution task {_shown(key)} is not in the specification"
                )
            if key in seen:
                raise WorkflowError(f"{where}: duplicate execution entry for task {_shown(key)}")
            seen.add(key)
            tw = f"{where}, task {_shown(key)}"
            raw = by_key[key]
            raw.runtime = _num(
                td.get("runtimeInSeconds"), "runtimeInSeconds", tw, most=MAX_RUNTIME_S
            )
            raw.cores = _num(td.get("coreCount"), "coreCount", tw, positive=True, most=MAX_CORES)
            raw.mem_bytes = _num(td.get("memoryInBytes"), "memoryInBytes", tw)
            command = td.get("command")
            if isinstance(command, dict) and isinstance(command.get("program"), str):
                raw.hints.append(command["program"])
    return raws


def _file_total(value: object, sizes: dict[str, float] | None, what: str, where: str) -> float:
    total = 0.0
    for ref in _list(value, what, where):
        fid = _ident(ref)
        if fid is None:
            raise WorkflowError(f"{where}: {what} holds an invalid file reference {_shown(ref)}")
        if sizes is not None:
            if fid not in sizes:
                raise WorkflowError(f"{where}: {what} refers to unknown file {_shown(fid)}")
            total += sizes[fid]
    return total


def _read_v14(wf: dict[str, Any], where: str) -> list[_Raw]:
    raws: list[_Raw] = []
    for i, t in enumerate(_list(wf.get("tasks"), "'workflow.tasks'", where, default_empty=False)):
        td = _obj(t, f"task #{i}", where)
        key = _ident(td.get("name")) or _ident(td.get("id"))
        if key is None:
            raise WorkflowError(f"{where}: task #{i} has neither a name nor an id")
        tw = f"{where}, task {_shown(key)}"
        hints = [key] + [v for k in ("category", "type") if isinstance(v := td.get(k), str)]
        command = td.get("command")
        if isinstance(command, dict) and isinstance(command.get("program"), str):
            hints.append(command["program"])
        memory = _num(td.get("memoryInBytes"), "memoryInBytes", tw)
        if memory is None and "memory" in td:
            memory = (_num(td.get("memory"), "memory", tw, most=MAX_NUMBER / KB) or 0.0) * KB
        raw = _Raw(
            key=key,
            name=key,
            hints=hints,
            parents=_refs(td.get("parents"), "parents", tw),
            children=_refs(td.get("children"), "children", tw),
            runtime=_num(
                _first(td, "runtimeInSeconds", "runtime"),
                "runtimeInSeconds",
                tw,
                most=MAX_RUNTIME_S,
            ),
            cores=_num(td.get("cores"), "cores", tw, positive=True, most=MAX_CORES),
            mem_bytes=memory,
            alt_key=_ident(td.get("id")),
        )
        for j, f in enumerate(_list(td.get("files"), "files", tw)):
            fd = _obj(f, f"file #{j}", tw)
            size = _num(_first(fd, "sizeInBytes", "size"), f"file #{j} sizeInBytes", tw) or 0.0
            link = str(fd.get("link", "")).lower()
            if link == "input":
                raw.input_bytes += size
            elif link == "output":
                raw.output_bytes += size
            else:
                raise WorkflowError(f"{tw}: file #{j} link must be 'input' or 'output'")
        raws.append(raw)
    return raws


def _unique(raws: list[_Raw], where: str) -> dict[str, _Raw]:
    """Tasks by key, in order; WorkflowError when there are none or a key repeats."""
    if not raws:
        raise WorkflowError(f"{where}: the workflow has no tasks")
    by_key: dict[str, _Raw] = {}
    for r in raws:
        if r.key in by_key:
            raise WorkflowError(f"{where}: duplicate task id {_shown(r.key)}")
        by_key[r.key] = r
    return by_key


def _resolve(raws: list[_Raw], where: str) -> tuple[list[TaskSpec], set[tuple[int, int]]]:
    index = {key: i for i, key in enumerate(_unique(raws, where))}
    for i, r in enumerate(raws):  # 1.4 ids as fallback references, never shadowing a name
        if r.alt_key is not None and r.alt_key not in index:
            index[r.alt_key] = i
    edges: set[tuple[int, int]] = set()
    for i, r in enumerate(raws):
        for ref, is_parent in [(p, True) for p in r.parents] + [(c, False) for c in r.children]:
            j = index.get(ref)
            if j is None:
                kind = "parent" if is_parent else "child"
                raise WorkflowError(
                    f"{where}, task {_shown(r.key)}: unknown {kind} task {_shown(ref)}"
                )
            edges.add((j, i) if is_parent else (i, j))
    tasks = []
    for r in raws:
        runtime = DEFAULT_RUNTIME_S if r.runtime is None else max(r.runtime, MIN_DURATION_S)
        mem = r.mem_bytes if r.mem_bytes else DEFAULT_MEM_BYTES
        tasks.append(
            TaskSpec(
                name=r.name,
                type=task_type_hint(r.hints),
                duration_s=runtime,
                cpu_cores=DEFAULT_CORES if r.cores is None else r.cores,
                mem_gb=mem / GB,
                input_bytes=r.input_bytes,
                output_bytes=r.output_bytes,
                family=family_of(r.hints[0] if r.hints else r.name),
            )
        )
    return tasks, edges
