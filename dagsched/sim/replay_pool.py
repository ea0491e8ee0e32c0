"""Where replays run: one after another in the caller's thread, or spread over worker processes.

A replay is CPU-bound Python (the simulator, and the policy's numpy), so threads would share one
core; the replays of a window are independent of one another, so processes can share them out.
A replay depends only on its world, its policy and its seed, so the results are the same
either way, in the same order (`tests/sim/test_replay_pool.py`).

- `InThread` plays them in the calling thread: no start-up cost, one core.
- `WorkerPool` plays them in `workers` processes (started with `spawn` on first use, and kept):
  each call splits its seeds into one contiguous run per worker, so a world and its policies
  are pickled once per worker, not once per replay. The policy factories must pickle
  (`sim.snapshot.PolicyOf`, `sim.replay_world.AsServedFactory`, a module-level function). A
  worker that dies (killed for memory) breaks the pool: the call is played again in this
  thread, and the next call starts a fresh pool. `close` stops the workers at once, replays
  under way included (a service stopping does not wait for a window's replays): a call they
  were playing raises `ReplaysClosed`; the next call starts a fresh pool. A worker whose
  service was killed without closing it exits within a second.

`replays_for(workers)` gives the one a setting asks for: 1 in this thread, 0 one process per
core, N that many.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import NamedTuple, Protocol

import structlog

from dagsched.sim.replay_world import PolicyFactory, ReplayResult, ReplayWorld, play

log = structlog.get_logger(__name__)


class ReplaysClosed(RuntimeError):
    """The pool was closed while it played these replays."""


class Plays(NamedTuple):
    """Replays of one policy over one world: one per seed."""

    world: ReplayWorld
    policy: PolicyFactory
    seeds: Sequence[int]


class Replays(Protocol):
    """Plays replays; `play_many` returns, for each `Plays`, one result per seed in order."""

    workers: int

    def play_many(self, jobs: Sequence[Plays]) -> list[list[ReplayResult]]: ...

    def close(self) -> None: ...


def play_seeds(
    world: ReplayWorld, policy: PolicyFactory, seeds: Sequence[int]
) -> list[ReplayResult]:
    """`policy`'s replays of `world`, one per seed, in this process."""
    return [play(world, policy(s), s) for s in seeds]


def play_one(
    replays: Replays, world: ReplayWorld, policy: PolicyFactory, seeds: Sequence[int]
) -> list[ReplayResult]:
    """One `Plays` through `replays`."""
    return replays.play_many([Plays(world, policy, seeds)])[0]


class InThread:
    """Replays in the calling thread."""

    workers = 1

    def play_many(self, jobs: Sequence[Plays]) -> list[list[ReplayResult]]:
        return [play_seeds(*job) for job in jobs]

    def close(self) -> None:
        pass


# how often a worker checks that the process that started it is still there
PARENT_CHECK_S = 1.0


def _start_worker(parent: int) -> None:
    """A worker's start, before its first job is unpickled and imports torch: one thread for
    torch's kernels, since the workers are the parallelism; and a watch on `parent` (the
    process that started the pool). A worker blocks waiting for work on a queue it holds
    both ends of, so a parent killed without closing its pool would leave it waiting for
    good: it exits once it finds itself adopted by another process."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _runs(seeds: Sequence[int], parts: int) -> list[Sequence[int]]:
    """`seeds` cut into at most `parts` contiguous runs of near-equal length."""
    n = len(seeds)
    parts = max(1, min(parts, n))
    cuts = [round(i * n / parts) for i in range(parts + 1)]
    return [seeds[a:b] for a, b in itertools.pairwise(cuts) if b > a]


class WorkerPool:
    """Replays spread over `workers` processes (see the module docstring)."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError("a worker pool needs at least one worker")
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # the judge and a search may share a pool
        self.restarts = 0  # pools found broken and replaced
        self._closed: weakref.WeakSet[ProcessPoolExecutor] = weakref.WeakSet()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_worker,
                    initargs=(os.getpid(),),
                )
            return self._pool

    def play_many(self, jobs: Sequence[Plays]) -> list[list[ReplayResult]]:
        pool = self._executor()
        # one run of seeds per worker for each job, every job's runs queued before any is
        # awaited: a worker that finishes early takes the next job's
        pending: list[list[Future[list[ReplayResult]]]] = []
        try:
            for job in jobs:
                runs = _runs(list(job.seeds), self.workers)
                pending.append([pool.submit(play_seeds, job.world, job.policy, r) for r in runs])
            return [[r for f in futures for r in f.result()] for futures in pending]
        except RuntimeError as exc:  # BrokenProcessPool is one, as is submitting after close
            if pool in self._closed:
                raise ReplaysClosed("the replay workers were stopped") from None
            if not isinstance(exc, BrokenProcessPool):
                raise
            log.warning("replays.pool_broken", error=str(exc), workers=self.workers)
            with self._lock:
                if self._pool is pool:
                    self._pool = None
                    self.restarts += 1
            pool.shutdown(wait=False, cancel_futures=True)
            return InThread().play_many(jobs)

    def close(self) -> None:
        """Stop the workers now, replays under way included (see the module docstring)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        self._closed.add(pool)
        # the executor has no public way to stop a running call (Python 3.14 adds
        # `terminate_workers`): its processes are stopped, then it is shut down
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)


def cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def replays_for(workers: int) -> Replays:
    """Where a setting says replays run: 1 in this thread, 0 one process per core (this
    thread when there is one core), N that many processes."""
    n = workers if workers > 0 else cores()
    return InThread() if n == 1 else WorkerPool(n)
