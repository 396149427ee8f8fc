"""Reading a query's timeline for people: which LLM calls had to be re-run, and why.

A call that timed out on one instance and was re-run on another shows up as one call with a
long queue wait; without the failed attempt next to it, "queue 23.6 s on an idle cluster"
reads as a scheduler bug. Every place that shows a timeline (CLI, Python ``Answer``, MCP)
uses ``retries_of`` so they say the same thing.
"""

from __future__ import annotations

from typing import Any


def retries_of(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per failed attempt of a call that later succeeded: node_id, stage,
    request_id, failed_on, error, rerun_on (stages as ``Answer.stages``)."""
    out = []
    for s in stages:
        for c in s.get("llm_calls") or []:
            for a in c.get("failed_attempts") or []:
                out.append({"node_id": s["node_id"], "stage": s.get("stage"),
                            "request_id": c.get("request_id"),
                            "failed_on": a.get("instance"), "error": a.get("error"),
                            "rerun_on": c.get("instance")})
    return out


def retry_lines(stages: list[dict[str, Any]]) -> list[str]:
    return [f"{r['node_id']}: {r['failed_on']} failed ({r['error']}), re-run on {r['rerun_on']}"
            for r in retries_of(stages)]
