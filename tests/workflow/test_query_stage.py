"""``Query.stage`` looks records up in an index that follows the timeline: a record appended
after a lookup is found, the first record of a node id wins (as the linear scan it replaced
returned), a replaced or shortened timeline is re-indexed, and the index is no field (equality
and ``asdict`` do not see it)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from agentflow.workflow.query import Query, StageRecord


def _record(node_id: str, stage: str = "s") -> StageRecord:
    return StageRecord(node_id=node_id, stage=stage, kind="llm", parents=[])


def test_stage_follows_the_timeline_as_it_grows_and_is_replaced() -> None:
    q = Query(question="q", db_id="d", arrival=0.0)
    with pytest.raises(KeyError):
        q.stage("a")
    first = _record("a")
    q.timeline.append(first)
    assert q.stage("a") is first
    q.timeline.append(_record("b"))
    q.timeline.append(_record("a", "later"))  # a second record of one id: the first wins
    assert q.stage("b").node_id == "b" and q.stage("a") is first
    replaced = _record("a", "new")
    q.timeline = [replaced]  # a new list: indexed afresh
    assert q.stage("a") is replaced
    with pytest.raises(KeyError):
        q.stage("b")
    q.timeline.clear()  # shrank: indexed afresh
    with pytest.raises(KeyError):
        q.stage("a")


def test_the_index_is_no_field() -> None:
    a, b = Query(question="q", db_id="d", arrival=0.0, id="x"), \
        Query(question="q", db_id="d", arrival=0.0, id="x")
    a.timeline.append(_record("n"))
    b.timeline.append(_record("n"))
    a.stage("n")
    assert a == b and asdict(a) == asdict(b) and "_stage_index" not in asdict(a)
