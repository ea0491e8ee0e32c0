"""Seven templates of real workflow shapes for the workload generator.

Each template is a function `(rng, size) -> (types, edges, names)`: a suggested `TaskType` and a
name per task, and edges (parent, child) over task indices in topological index order. The
result has roughly `size` tasks (within +-50% from size 8 up; a template never goes below its
own minimum shape, 3 to 11 tasks), exactly one entry and one exit, and is connected.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dagsched.core.workflow import TaskType

Shape = tuple[list[TaskType], list[tuple[int, int]], list[str]]
Template = Callable[[np.random.Generator, int], Shape]

CPU, IO, GPU, MEM = TaskType.CPU, TaskType.IO, TaskType.GPU, TaskType.MEM


class _Builder:
    """Accumulates tasks and edges; `add` returns the new task's index."""

    def __init__(self) -> None:
        self.types: list[TaskType] = []
        self.names: list[str] = []
        self.edges: list[tuple[int, int]] = []

    def add(self, name: str, kind: TaskType, parents: list[int] | tuple[int, ...] = ()) -> int:
        i = len(self.names)
        self.names.append(name)
        self.types.append(kind)
        self.edges.extend((p, i) for p in parents)
        return i

    def group(self, prefix: str, kinds: list[TaskType], parents: list[int]) -> list[int]:
        """Parallel tasks `prefix-0..`, each a child of every task in `parents`."""
        return [self.add(f"{prefix}-{j}", k, parents) for j, k in enumerate(kinds)]

    def shape(self) -> Shape:
        return self.types, sorted(self.edges), self.names


def _jitter(rng: np.random.Generator, size: int) -> int:
    """`size` nudged by up to +-15% so repeated draws of one size differ a little."""
    return max(1, round(size * float(rng.uniform(0.85, 1.15))))


def _split(rng: np.random.Generator, total: int, parts: int) -> list[int]:
    """`total` split into `parts` random positive counts (total >= parts)."""
    cuts = np.sort(rng.choice(np.arange(1, total), size=parts - 1, replace=False))
    bounds = [0, *cuts.tolist(), total]
    return [bounds[k + 1] - bounds[k] for k in range(parts)]


def _pick(rng: np.random.Generator, kinds: tuple[TaskType, ...], n: int) -> list[TaskType]:
    return [kinds[int(i)] for i in rng.integers(len(kinds), size=n)]


def mapreduce(rng: np.random.Generator, size: int) -> Shape:
    """split -> N maps (cpu) -> shuffle -> M reduces -> merge."""
    work = max(2, _jitter(rng, size) - 3)
    reduces = max(1, min(work - 1, round(work * float(rng.uniform(0.15, 0.35)))))
    b = _Builder()
    split = b.add("split", IO)
    maps = b.group("map", [CPU] * (work - reduces), [split])
    shuffle = b.add("shuffle", IO, maps)
    reds = b.group("reduce", _pick(rng, (CPU, MEM), reduces), [shuffle])
    b.add("merge", IO, reds)
    return b.shape()


def spark_shuffle(rng: np.random.Generator, size: int) -> Shape:
    """read -> 2-3 stages with all-to-all (wide) dependencies between stages -> collect."""
    work = max(2, _jitter(rng, size) - 2)
    n_stages = min(work, int(rng.integers(2, 4)))
    b = _Builder()
    prev = [b.add("read", IO)]
    for k, width in enumerate(_split(rng, work, n_stages)):
        kinds = [CPU] * width if k == 0 else _pick(rng, (CPU, MEM, MEM), width)
        prev = b.group(f"stage{k}", kinds, prev)
    b.add("collect", IO, prev)
    return b.shape()


_CICD_PRE = ("deps", "lint", "codegen", "compile-assets", "typecheck")
_CICD_POST = ("integration-test", "scan", "sign", "publish", "deploy-staging", "smoke-test")


def cicd_chain(rng: np.random.Generator, size: int) -> Shape:
    """checkout -> build -> parallel unit tests -> package -> deploy, with extra chain steps."""
    total = max(5, _jitter(rng, size))
    tests = max(1, round((total - 4) * float(rng.uniform(0.3, 0.5))))
    extra = total - 4 - tests
    n_pre = int(rng.integers(0, extra + 1)) if extra > 0 else 0
    pre = [_CICD_PRE[i] if i < len(_CICD_PRE) else f"pre-step-{i}" for i in range(n_pre)]
    n_post = extra - n_pre
    post = [_CICD_POST[i] if i < len(_CICD_POST) else f"step-{i}" for i in range(n_post)]
    b = _Builder()
    last = b.add("checkout", IO)
    for name in pre:
        last = b.add(name, CPU, [last])
    build = b.add("build", CPU, [last])
    units = b.group("unit-test", [CPU] * tests, [build])
    last = b.add("package", IO, units)
    for name in post:
        last = b.add(name, IO if name.startswith(("publish", "deploy")) else CPU, [last])
    b.add("deploy", IO, [last])
    return b.shape()


def fork_join(rng: np.random.Generator, size: int) -> Shape:
    """fork -> (parallel tasks -> join) repeated 1-4 times; each join forks the next block."""
    total = max(3, _jitter(rng, size))
    blocks = max(1, min(int(rng.integers(1, 5)), (total - 1) // 3))
    work = total - 1 - blocks
    b = _Builder()
    last = b.add("fork", CPU)
    for k, width in enumerate(_split(rng, work, blocks)):
        tasks = b.group(f"task{k}", _pick(rng, (CPU, CPU, MEM), width), [last])
        last = b.add(f"join-{k}", CPU, tasks)
    return b.shape()


def etl(rng: np.random.Generator, size: int) -> Shape:
    """trigger -> extract (io) + clean per source -> join -> transforms (cpu/mem) -> load."""
    work = max(3, _jitter(rng, size) - 3)
    sources = max(1, min((work - 1) // 2, round(work * float(rng.uniform(0.2, 0.35)))))
    transforms = work - 2 * sources
    b = _Builder()
    trigger = b.add("trigger", CPU)
    extracts = b.group("extract", [IO] * sources, [trigger])
    cleans = [b.add(f"clean-{j}", CPU, [e]) for j, e in enumerate(extracts)]
    join = b.add("join", MEM, cleans)
    trans = b.group("transform", _pick(rng, (CPU, MEM), transforms), [join])
    b.add("load", IO, trans)
    return b.shape()


def ml_training(rng: np.random.Generator, size: int) -> Shape:
    """fetch -> prep (io/mem) -> K parallel trials (gpu) [-> eval] -> select-best -> register."""
    work = max(1, _jitter(rng, size) - 4)
    with_eval = work >= 4 and bool(rng.random() < 0.5)
    trials = max(1, work // 2 if with_eval else work)
    b = _Builder()
    fetch = b.add("fetch-data", IO)
    prep = b.add("prep", MEM, [fetch])
    ends = b.group("trial", [GPU] * trials, [prep])
    if with_eval:
        ends = [b.add(f"eval-{j}", CPU, [t]) for j, t in enumerate(ends)]
    select = b.add("select-best", CPU, ends)
    b.add("register", IO, [select])
    return b.shape()


def _montage_grid(n: int, cols: int) -> list[tuple[int, int]]:
    """Neighbour pairs of `n` images laid out row-major in `cols` columns."""
    pairs = [(i, i + 1) for i in range(n - 1) if (i + 1) % cols]
    pairs += [(i, i + cols) for i in range(n - cols)]
    return pairs


def montage(rng: np.random.Generator, size: int) -> Shape:
    """Montage-like mosaic: stage-in -> mProject fan-out -> mDiffFit on neighbour pairs ->
    mConcatFit -> mBgModel -> mBackground fan-out -> mImgtbl -> mAdd -> mShrink -> mJPEG."""
    target = _jitter(rng, size)
    wide = bool(rng.random() < 0.5)  # a 2-D mosaic (more pairs) or a strip

    def layout(n: int) -> tuple[int, list[tuple[int, int]]]:
        cols = max(1, round(n**0.5)) if wide else n
        pairs = _montage_grid(n, cols)
        return 2 * n + len(pairs) + 7, pairs

    n = 2
    while layout(n + 1)[0] <= target:
        n += 1
    pairs = layout(n)[1]
    b = _Builder()
    stage = b.add("stage-in", IO)
    projects = b.group("mProject", [CPU] * n, [stage])
    diffs = [
        b.add(f"mDiffFit-{k}", CPU, [projects[i], projects[j]]) for k, (i, j) in enumerate(pairs)
    ]
    concat = b.add("mConcatFit", CPU, diffs)
    model = b.add("mBgModel", CPU, [concat])
    backs = [b.add(f"mBackground-{i}", CPU, [model, p]) for i, p in enumerate(projects)]
    tbl = b.add("mImgtbl", IO, backs)
    add = b.add("mAdd", IO, [tbl])
    shrink = b.add("mShrink", CPU, [add])
    b.add("mJPEG", CPU, [shrink])
    return b.shape()


TEMPLATES: dict[str, Template] = {
    "mapreduce": mapreduce,
    "spark_shuffle": spark_shuffle,
    "cicd_chain": cicd_chain,
    "fork_join": fork_join,
    "etl": etl,
    "ml_training": ml_training,
    "montage": montage,
}
