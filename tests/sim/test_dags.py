import numpy as np

from dagsched.core.workflow import TaskSpec, TaskType, Workflow
from dagsched.sim.dags import drop_edges, layer_count, layer_widths, layered_dag


def _build(n, edges):
    tasks = [TaskSpec(f"t{i}", TaskType.CPU, 1.0, 1.0, 1.0) for i in range(n)]
    return Workflow.build("w", tasks, edges)


def _layers_of(wf):
    """Layer index per task: longest path from the entry."""
    level = [0] * wf.size
    for i in wf.topo:
        level[i] = max((level[p] + 1 for p in wf.parents[i]), default=0)
    return level


def test_layer_count_formula():
    assert layer_count(100, 1.0) == 10
    assert layer_count(100, 0.5) == 20
    assert layer_count(100, 2.0) == 5
    assert layer_count(100, 5.0) == 3  # never fewer than 3
    assert layer_count(10, 0.1) == 10  # capped: every middle layer keeps >= 1 task
    assert layer_count(2, 1.0) == 2
    assert layer_count(1, 1.0) == 1
    assert layer_count(50, 0.7) == 10  # sqrt(50) = 7.07; / 0.7 = 10.1
    assert layer_count(64, 0.3) == 26  # 8 / 0.3 = 26.7
    assert layer_count(20, 0.3) == 14  # 4.47 / 0.3 = 14.9
    assert layer_count(9, 0.5) == 6
    assert layer_count(4, 0.3) == 4  # 2 / 0.3 = 6.7, capped at the size
    assert layer_count(3, 1.0) == 3
    # and the shape of the rule: within [3, size], fewer layers for larger alpha, more for
    # larger workflows
    alphas = (0.3, 0.7, 1.0, 1.5)
    for size in range(3, 80):
        counts = [layer_count(size, a) for a in alphas]
        assert all(3 <= c <= size for c in counts), size
        assert counts == sorted(counts, reverse=True), size
        assert all(layer_count(size + 1, a) >= c for a, c in zip(alphas, counts, strict=True))


def test_layer_widths_hit_exact_size():
    rng = np.random.default_rng(3)
    for size in range(3, 120, 7):
        for alpha, beta in ((0.5, 0.0), (1.0, 1.0), (1.5, 2.0)):
            widths = layer_widths(rng, size, alpha, beta)
            assert sum(widths) == size
            assert widths[0] == 1 and widths[-1] == 1
            assert min(widths) >= 1
            assert len(widths) == layer_count(size, alpha)


def test_layered_dag_structure():
    rng = np.random.default_rng(7)
    for size in (2, 3, 4, 5, 8, 13, 40, 90):
        for max_out in (1, 2, 4):
            edges = layered_dag(rng, size, max_out, float(rng.uniform(0.5, 1.5)), 0.6)
            assert edges == sorted(edges)
            assert all(0 <= p < c < size for p, c in edges)
            wf = _build(size, edges)  # acyclic, no dangling edges
            assert wf.entries() == [0]
            assert wf.exits() == [size - 1]
            assert all(wf.parents[i] for i in range(1, size))
            assert all(wf.children[i] for i in range(size - 1))
            assert wf.is_connected()


def test_layered_dag_edges_only_between_consecutive_layers():
    rng = np.random.default_rng(11)
    edges = layered_dag(rng, 60, 3, 0.8, 0.5)
    wf = _build(60, edges)
    level = _layers_of(wf)
    assert all(level[c] == level[p] + 1 for p, c in edges)
    assert max(level) + 1 == layer_count(60, 0.8)


def test_layered_dag_size_two():
    assert layered_dag(np.random.default_rng(0), 2, 3, 1.0, 0.5) == [(0, 1)]


def test_layered_dag_is_deterministic():
    a = layered_dag(np.random.default_rng(42), 50, 3, 1.0, 0.5)
    b = layered_dag(np.random.default_rng(42), 50, 3, 1.0, 0.5)
    c = layered_dag(np.random.default_rng(43), 50, 3, 1.0, 0.5)
    assert a == b
    assert a != c


def _dense(width, layers):
    """Complete bipartite links between consecutive layers, single entry and exit."""
    idx = 1
    prev = [0]
    edges = []
    for _ in range(layers):
        cur = list(range(idx, idx + width))
        idx += width
        edges += [(p, c) for p in prev for c in cur]
        prev = cur
    edges += [(p, idx) for p in prev]
    return idx + 1, edges


def test_drop_edges_removes_fraction_and_keeps_connectivity():
    n, edges = _dense(5, 4)
    rng = np.random.default_rng(5)
    for fraction in (0.0, 0.05, 0.1, 0.3):
        kept = drop_edges(rng, n, edges, fraction)
        assert len(edges) - len(kept) == round(fraction * len(edges))
        assert set(kept) <= set(edges)
        wf = _build(n, kept)
        assert wf.entries() == [0] and wf.exits() == [n - 1]
        assert wf.is_connected()


def test_drop_edges_on_random_dags_keeps_single_entry_exit():
    rng = np.random.default_rng(9)
    for _ in range(50):
        size = int(rng.integers(2, 60))
        edges = layered_dag(rng, size, 4, 1.0, 0.5)
        kept = drop_edges(rng, size, edges, 0.5)
        assert len(kept) >= size - 1
        assert len(edges) - len(kept) <= round(0.5 * len(edges))
        wf = _build(size, kept)
        assert wf.entries() == [0] and wf.exits() == [size - 1]
        assert wf.is_connected()


def test_drop_edges_never_removes_bridges():
    chain = [(0, 1), (1, 2), (2, 3)]
    assert drop_edges(np.random.default_rng(0), 4, chain, 0.9) == chain


def test_drop_edges_is_deterministic():
    n, edges = _dense(4, 3)
    a = drop_edges(np.random.default_rng(1), n, edges, 0.2)
    b = drop_edges(np.random.default_rng(1), n, edges, 0.2)
    assert a == b
