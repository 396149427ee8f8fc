"""Runs a ``WorkflowRun`` on asyncio: independent stages concurrently, growth as it comes.

A stage that raises fails the query with the stage's name and error; its siblings are
cancelled, so nothing keeps running for a query that is already lost. Pipelines turn
*expected* trouble (SQL that does not execute, an empty answer) into outputs, not exceptions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agentflow.llm.base import BackendError
from agentflow.workflow.context import StageContext
from agentflow.workflow.graph import GraphError, Node, WorkflowRun
from agentflow.workflow.query import QueryStatus
from agentflow.workflow.router import CallRouter


class StageFailed(RuntimeError):
    def __init__(self, node_id: str, error: BaseException):
        super().__init__(f"stage {node_id} failed: {_describe(error)}")
        self.node_id = node_id
        self.error = error


Observer = Callable[[dict[str, Any]], None]


async def execute(run: WorkflowRun, router: CallRouter, env: Any,
                  state: dict[str, Any] | None = None,
                  observer: Observer | None = None) -> dict[str, Any]:
    """Drive ``run`` to completion; returns the per-query state (the pipeline's blackboard).

    The query's status and error are set here; cancelling the awaiting task cancels every
    running stage and marks the query cancelled. ``observer`` hears of every stage that
    starts, finishes or fails (live progress for the web page and SSE streams).
    """
    notify = _notifier(run, observer)
    clock = router.clock
    query = run.query
    state = {} if state is None else state
    query.status = QueryStatus.RUNNING
    tasks: dict[asyncio.Task, str] = {}
    contexts: dict[str, StageContext] = {}
    try:
        while True:
            for node in run.ready():
                run.mark_started(node.id, clock.now())
                notify("stage_started", node.id)
                ctx = StageContext(run=run, node=node, router=router, env=env, state=state)
                contexts[node.id] = ctx
                tasks[asyncio.ensure_future(_run_node(node, ctx))] = node.id
            if not tasks:
                break
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                node_id = tasks.pop(task)
                ctx = contexts.pop(node_id)
                error = task.exception()
                if error is not None:
                    run.mark_failed(node_id, clock.now(), _describe(error))
                    notify("stage_failed", node_id)
                    raise StageFailed(node_id, error) from error
                try:
                    run.mark_done(node_id, clock.now(), task.result(), ctx.expansion,
                                  ctx.summary)
                    notify("stage_finished", node_id)
                except GraphError as err:
                    run.mark_failed(node_id, clock.now(), str(err))
                    raise StageFailed(node_id, err) from err
    except StageFailed as err:
        await _cancel(tasks)
        run.cancel_pending(clock.now())
        query.status, query.error = QueryStatus.FAILED, str(err)
    except asyncio.CancelledError:
        await _cancel(tasks)
        run.cancel_pending(clock.now())
        query.status, query.error = QueryStatus.CANCELLED, query.error or "cancelled"
        query.finished = clock.now()
        raise
    else:
        query.status = QueryStatus.DONE
    query.finished = clock.now()
    return state


def _notifier(run: WorkflowRun, observer: Observer | None) -> Callable[[str, str], None]:
    def notify(kind: str, node_id: str) -> None:
        if observer is None:
            return
        record = run.query.stage(node_id)
        calls = record.llm_calls
        observer({"type": kind, "query_id": run.query.id, "node_id": node_id,
                  "stage": record.stage, "kind": record.kind, "parents": record.parents,
                  "start": None if record.start is None else record.start - run.query.arrival,
                  "end": None if record.end is None else record.end - run.query.arrival,
                  "summary": record.summary, "error": record.error,
                  "instance": calls[-1].instance if calls else None,
                  "queue_s": sum(c.queue_s for c in calls), "run_s": sum(c.run_s for c in calls),
                  "prompt_tokens": sum(c.prompt_tokens for c in calls),
                  "completion_tokens": sum(c.completion_tokens for c in calls)})
    return notify


async def _run_node(node: Node, ctx: StageContext) -> Any:
    return await node.run(ctx)


async def _cancel(tasks: dict[asyncio.Task, str]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    tasks.clear()


def _describe(error: BaseException) -> str:
    if isinstance(error, BackendError):
        return f"LLM backend error: {error}"
    text = str(error) or type(error).__name__
    if isinstance(error, (GraphError, StageFailed)):
        return text
    return f"{type(error).__name__}: {text}"
