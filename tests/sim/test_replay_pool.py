"""Replays in worker processes give what they give in this thread, seed by seed, and a pool
closed under a call stops it instead of playing on."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
import time
from functools import partial
from typing import Any

from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import ObservedWindow, TrafficRecorder
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.replay_pool import (
    InThread,
    Plays,
    ReplaysClosed,
    WorkerPool,
    _runs,
    cores,
    replays_for,
)
from dagsched.sim.replay_world import as_served
from dagsched.sim.runner import make_policy, stream_workflows
from dagsched.sim.runs import Policy
from dagsched.sim.snapshot import PolicyOf


def _window() -> tuple[ObservedWindow, ScenarioConfig]:
    sc = load_settings(profile="test").sim
    wins = record_run(
        lambda wfs, hook: Simulator(sc, wfs, seed=4, on_outcome=hook),
        make_policy("heft_history", 4), TrafficRecorder(20, 10), stream_workflows(sc, 4, 40),
    )  # fmt: skip
    return wins[0], sc


def test_seeds_are_cut_into_one_contiguous_run_per_worker() -> None:
    assert [len(r) for r in _runs([1, 2, 3, 4, 5], 2)] in ([3, 2], [2, 3])
    assert _runs([1, 2], 5) == [[1], [2]]
    assert [s for r in _runs(list(range(16)), 3) for s in r] == list(range(16))
    assert isinstance(replays_for(1), InThread)
    assert replays_for(3).workers == 3


def test_worker_processes_replay_exactly_as_this_thread_does() -> None:
    # torch only here: a worker unpickling `_Announcing` imports this module, and need not
    from dagsched.policy.bundle import load_bundle
    from dagsched.registry.store import SHIPPED_CHAMPION

    obs, sc = _window()
    world = obs.world(sc)
    gnn = PolicyOf(load_bundle(SHIPPED_CHAMPION, "v1"), "v1")
    heft = partial(make_policy, "heft_history")
    # a window half served by another version: the factory of factories pickles too
    mixed = as_served(gnn, dict.fromkeys([w.id for w in obs.workflows[::2]], heft))
    jobs = [Plays(world, gnn, [11, 12, 13]), Plays(world, mixed, [11, 12, 13])]
    here = InThread().play_many(jobs)
    pool = WorkerPool(2)
    try:
        there = pool.play_many(jobs)
    finally:
        pool.close()
    assert pool.restarts == 0
    assert [[r.jct_s for r in got] for got in there] == [[r.jct_s for r in got] for got in here]
    assert [[r.rewards for r in got] for got in there] == [[r.rewards for r in got] for got in here]
    # the seeds and the policies matter: the comparison above could fail
    assert here[0][0].jct_s != here[0][1].jct_s or here[0][0].jct_s != here[1][0].jct_s


class _Announcing:
    """heft_history's factory that says when a worker has begun a replay."""

    def __init__(self, began: Any) -> None:
        self.began = began

    def __call__(self, seed: int) -> Policy:
        self.began.set()
        return make_policy("heft_history", seed)


def test_closing_the_pool_stops_a_call_under_way() -> None:
    obs, sc = _window()
    world = obs.world(sc)
    pool = WorkerPool(1)
    got: list[BaseException] = []
    with multiprocessing.Manager() as manager:
        began = manager.Event()
        heft = _Announcing(began)

        def call() -> None:
            try:
                pool.play_many([Plays(world, heft, list(range(200)))])
            except BaseException as exc:  # what the call raised is the point
                got.append(exc)

        t = threading.Thread(target=call)
        t.start()
        assert began.wait(timeout=120)  # a worker is playing the call's replays
        pool.close()
    t.join(timeout=60)
    assert not t.is_alive()
    assert len(got) == 1 and isinstance(got[0], ReplaysClosed)
    # the next call starts a fresh pool
    try:
        again = pool.play_many([Plays(world, partial(make_policy, "heft_history"), [1])])
        assert len(again[0]) == 1
    finally:
        pool.close()


def test_zero_workers_means_one_per_core() -> None:
    assert replays_for(0).workers == cores()


_SERVICE = """
import os, sys
from functools import partial
from dagsched.sim.replay_pool import Plays, WorkerPool
from dagsched.sim.runner import make_policy
from tests.sim.test_replay_pool import _window

obs, sc = _window()
pool = WorkerPool(2)
pool.play_many([Plays(obs.world(sc, 0), partial(make_policy, "heft_history"), [1, 2])])
me = str(os.getpid())
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
        cmd = open(f"/proc/{pid}/cmdline").read()
    except OSError:
        continue
    if stat.rsplit(")", 1)[1].split()[1] == me and "spawn_main" in cmd:
        print(pid, flush=True)
print("ready", flush=True)
sys.stdin.read()  # until killed
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_exit_when_their_service_is_killed() -> None:
    service = subprocess.Popen(
        [sys.executable, "-c", _SERVICE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert service.stdout is not None
    workers = []
    for line in service.stdout:
        if line.strip() == "ready":
            break
        workers.append(int(line))
    assert len(workers) == 2 and all(_running(w) for w in workers)
    service.kill()  # no close, no clean-up: kill -9
    service.wait()
    deadline = time.monotonic() + 30
    while any(_running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling processes that are not ours to wait for
    assert not any(_running(w) for w in workers)
