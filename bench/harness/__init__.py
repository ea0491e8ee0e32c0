"""Shared harness for benchmarks of the streaming services, all on one machine.

- `stack`: a temporary home, a Redis (the given URL when it answers, else a private
  `redis-server`), the embedded Tansu broker, and settings that point at them under a fresh
  topic and key prefix, all removed on exit; and `git_state`, the commit a bench measured.
- `replicas`: `dagsched daemon` replicas as separate processes, with what their JSON log lines
  said (partition assignments, model loads and swaps, notices, warnings).
- `watch`: reads `dagsched.tasks` and `dagsched.decisions` from the beginning, to check that
  every task asked for got exactly one decision.
- `kafka_io` and `throughput_report`: the daemon throughput bench's workload, Kafka traffic
  (confluent-kafka from the bench process), measures and tables.
- `traffic`: back-to-back closed-loop replays (`dagsched.daemon.replay`) in a process of their
  own, so they do not share a GIL with the bench; that file is the process's entry point.

- `soak_load`: bench/soak.py's job queue and cluster in one thread: workflows whose tasks
  become ready as their parents finish, offered at a steady rate, each decision's attempt
  reported started and ended, and the updater's lag.

- `chaos_services` and `chaos_load`: bench/chaos.py's stack of processes it can take away
  (Redis with an AOF, Tansu, an `mlflow server`, daemons, learner, evaluator) and its steady
  load and per-task answers.

Benchmarks run as scripts (`python bench/NAME.py`), so bench/ is on `sys.path` and they import
this package as `harness` (e.g. `from harness.replicas import start_replica`). Used by
bench/switch_time.py and bench/daemon_throughput.py.
"""
