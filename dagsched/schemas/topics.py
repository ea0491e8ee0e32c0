"""Which message types belong on which topic, and what each topic is keyed by.

Topic names themselves come from settings (`settings.topic("tasks")`, with the prefix).
"""

from __future__ import annotations

TOPICS: tuple[str, ...] = ("tasks", "decisions", "events", "deadletter", "decisionlog")

# topic (settings name) -> message `type` values accepted there
ALLOWED_TYPES: dict[str, frozenset[str]] = {
    "tasks": frozenset({"workflow", "task_ready"}),
    "decisions": frozenset({"decision"}),
    "events": frozenset(
        {"task_started", "task_finished", "task_failed", "node_heartbeat", "node_down", "node_up"}
    ),
    "deadletter": frozenset({"dead_letter"}),
    "decisionlog": frozenset({"decision_log", "decision_batch"}),
}

# topic -> what the record key is
KEYS: dict[str, str] = {
    "tasks": "workflow id",
    "decisions": "workflow id",
    "events": "node id",
    "deadletter": "the original record's key",
    "decisionlog": "workflow id (decision_log); none (decision_batch)",
}
