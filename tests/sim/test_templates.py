import itertools

import numpy as np

from dagsched.core.workflow import TaskSpec, TaskType, Workflow
from dagsched.sim.templates import TEMPLATES

NAMES = ("mapreduce", "spark_shuffle", "cicd_chain", "fork_join", "etl", "ml_training", "montage")


def _build(types, edges, names):
    tasks = [TaskSpec(n, t, 1.0, 1.0, 1.0) for n, t in zip(names, types, strict=True)]
    return Workflow.build("w", tasks, edges)


def test_template_keys():
    assert tuple(TEMPLATES) == NAMES


def test_each_template_shape():
    rng = np.random.default_rng(0)
    for name, make in TEMPLATES.items():
        for size in (2, 3, 5, 8, 12, 20, 40, 80, 200):
            for _ in range(3):
                types, edges, names = make(rng, size)
                assert len(types) == len(names) >= 3, name
                assert all(isinstance(t, TaskType) for t in types)
                assert len(set(names)) == len(names), (name, names)
                assert all(p < c for p, c in edges), name
                wf = _build(types, edges, names)
                assert len(wf.entries()) == 1, (name, size)
                assert len(wf.exits()) == 1, (name, size)
                assert wf.is_connected(), (name, size)
                if size >= 8:
                    assert 0.5 * size <= wf.size <= 1.5 * size, (name, size, wf.size)


def test_templates_are_deterministic():
    for make in TEMPLATES.values():
        assert make(np.random.default_rng(4), 30) == make(np.random.default_rng(4), 30)


def test_template_contents():
    rng = np.random.default_rng(1)
    types, _, names = TEMPLATES["mapreduce"](rng, 20)
    assert names[0] == "split" and names[-1] == "merge" and "shuffle" in names
    assert all(t is TaskType.CPU for t, n in zip(types, names, strict=True) if n.startswith("map-"))
    types, _, names = TEMPLATES["ml_training"](rng, 20)
    assert any(t is TaskType.GPU for t in types) and names[-1] == "register"
    types, _, names = TEMPLATES["etl"](rng, 20)
    assert all(t is TaskType.IO for t, n in zip(types, names, strict=True) if "extract" in n)
    assert names[-1] == "load"
    _, edges, names = TEMPLATES["montage"](rng, 40)
    assert names[-1] == "mJPEG"
    for p, c in edges:
        if names[c].startswith("mDiffFit"):
            assert names[p].startswith("mProject")
    diffs = [i for i, n in enumerate(names) if n.startswith("mDiffFit")]
    assert all(sum(1 for _, c in edges if c == d) == 2 for d in diffs)


def test_spark_shuffle_is_all_to_all():
    _, edges, names = TEMPLATES["spark_shuffle"](np.random.default_rng(2), 30)
    stages: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        if n.startswith("stage"):
            stages.setdefault(n.split("-")[0], []).append(i)
    keys = sorted(stages)
    assert 2 <= len(keys) <= 3
    es = set(edges)
    for a, b in itertools.pairwise(keys):
        assert all((p, c) in es for p in stages[a] for c in stages[b])
