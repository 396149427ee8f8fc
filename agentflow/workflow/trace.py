"""Trace records: one JSON object per query with the DAG of calls as it actually ran.

The simulator replays these (token counts and timings, and the text so real pipeline logic can
drive the DAG again); evaluation reads the SQL and status. Times are seconds since the
query's arrival.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from agentflow.workflow.query import Query

TRACE_FORMAT = "agentflow-trace/1"


def trace_record(query: Query, *, pipeline: dict[str, Any], sql: str | None,
                 texts: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    texts = texts or {}
    nodes = []
    for r in query.timeline_dicts():
        calls = []
        for c in r["llm_calls"]:
            text = texts.get(c["request_id"], {})
            calls.append({
                "request_id": c["request_id"], "instance": c["instance"],
                "priority": c["priority"], "prompt_tokens": c["prompt_tokens"],
                "completion_tokens": c["completion_tokens"],
                "cached_prompt_tokens": c["cached_prompt_tokens"],
                "submitted": c["submitted"], "started": c["started"], "finished": c["finished"],
                "queue_s": c["queue_s"], "run_s": c["run_s"],
                "finish_reason": c["finish_reason"], "max_tokens": c.get("max_tokens"),
                "prompt": text.get("prompt"), "output": text.get("output")})
        nodes.append({"id": r["node_id"], "stage": r["stage"], "kind": r["kind"],
                      "parents": r["parents"], "expanded_by": r["expanded_by"],
                      "start": r["start"], "end": r["end"],
                      "status": r["status"], "error": r["error"], "summary": r["summary"],
                      "calls": calls})
    return {"format": TRACE_FORMAT, "query_id": query.id, "question": query.question,
            "db_id": query.db_id, "evidence": query.evidence, "pipeline": pipeline,
            "status": query.status.value, "error": query.error, "sql": sql,
            "slo_s": query.slo_s, "latency_s": query.latency_s,
            "slo_class": query.slo_class, "tenant": query.tenant,  # for class-aware replays
            "nodes": nodes}


class TraceWriter:
    """Appends trace lines to a JSONL file; safe to share across threads."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=str)
        with self._lock, self.path.open("a") as fh:
            fh.write(line + "\n")


def read_traces(path: str | Path) -> list[dict[str, Any]]:
    with Path(path).open() as fh:
        return [json.loads(line) for line in fh if line.strip()]
