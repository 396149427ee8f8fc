"""Real mode: every question through the real pipeline and backends, at its arrival time."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from agentflow.config import AgentFlowConfig
from agentflow.datasets import Example
from agentflow.evaluation.records import (
    Judge,
    RecordStore,
    critical_path_s,
    difficulty_of,
    hardness_or_none,
    stage_rows,
    usage_fields,
)

OnRecord = Callable[[dict[str, Any]], None]


def arrival_offsets(n: int, rate: float | None, arrival: str | None,
                    seed: int) -> list[float] | None:
    """Seconds after the start at which each question is submitted; ``None``: one at a time."""
    from agentflow.sim.workload import arrival_times

    if rate is None and not (arrival or "").startswith("steps:"):
        return None
    return [float(t) for t in arrival_times(n, rate or 1.0, arrival or "poisson", seed=seed)]


def run_config(base: AgentFlowConfig, *, policy: str, trace_path: Path,
               dataset_root: str | None, split: str) -> AgentFlowConfig:
    cfg = base.model_copy(deep=True)
    cfg.scheduler.policy = policy
    cfg.record = str(trace_path)
    if dataset_root and dataset_root not in cfg.data:
        cfg.data = [*cfg.data, dataset_root]
    if split == "train" and cfg.fewshot == "auto":
        cfg.fewshot = None  # the few-shot pool is the train split: it would hold the answers
    return cfg


def run_real(examples: list[Example], *, kind: str, pipeline: str, policy: str,
             config: AgentFlowConfig, store: RecordStore, judge: Judge,
             backends: dict[str, Any] | None, offsets: list[float] | None,
             slo_s: float | None, session: str, on_record: OnRecord | None = None,
             on_submit: Callable[[Example], None] | None = None,
             slo_class: str | None = None) -> int:
    """Ask ``examples`` (those not finished yet) and write one record per question.
    Returns how many were asked."""
    from agentflow.api import AgentFlow

    af = AgentFlow(config, backends=backends)
    judge_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentflow-judge")
    judged: list[Future] = []
    inflight: dict[Future, tuple[Example, float]] = {}
    start = time.monotonic()

    def now() -> float:
        return time.monotonic() - start

    def finish(example: Example, submitted: float, future: Future | None,
               error: str | None = None) -> None:
        answer = None
        if future is not None:
            try:
                answer = future.result()
            except Exception as err:  # noqa: BLE001 - an internal error is recorded, not fatal
                error = f"{type(err).__name__}: {err}"
        record = _record(example, kind=kind, pipeline=pipeline, policy=policy, answer=answer,
                         error=error, judge=judge, submitted=submitted, finished=now(),
                         slo_s=slo_s, session=session)
        store.write(record)
        if on_record is not None:
            on_record(record)

    try:
        i = 0
        while i < len(examples) or inflight:
            if i < len(examples):
                due = offsets[i] if offsets is not None else 0.0
                can_submit = offsets is not None or not inflight
                if can_submit and now() >= due:
                    example = examples[i]
                    i += 1
                    submitted = now()
                    if on_submit is not None:
                        on_submit(example)
                    try:
                        handle = af.submit(example.question, example.db_id, slo=slo_s,
                                           pipeline=pipeline, evidence=example.evidence,
                                           slo_class=slo_class)
                    except Exception as err:  # noqa: BLE001 - bad input is recorded per question
                        judged.append(judge_pool.submit(
                            finish, example, submitted, None, f"{type(err).__name__}: {err}"))
                        continue
                    inflight[handle.future] = (example, submitted)
                    continue
                timeout = max(0.0, due - now()) if can_submit else None
            else:
                timeout = None
            if inflight:
                done, _ = wait(list(inflight), timeout=timeout, return_when=FIRST_COMPLETED)
                for future in done:
                    example, submitted = inflight.pop(future)
                    judged.append(judge_pool.submit(finish, example, submitted, future))
            elif timeout:
                time.sleep(timeout)
        for job in judged:
            job.result()  # surface a failure to judge or write
    finally:
        af.close(drain_s=0.0)
        judge_pool.shutdown(wait=True)
    return len(examples)


def _record(example: Example, *, kind: str, pipeline: str, policy: str, answer: Any,
            error: str | None, judge: Judge, submitted: float, finished: float,
            slo_s: float | None, session: str) -> dict[str, Any]:
    level, source = difficulty_of(example, kind)
    base = {"example_id": example.id, "db_id": example.db_id, "question": example.question,
            "difficulty": level, "difficulty_source": source,
            "spider_hardness": hardness_or_none(example.gold_sql),
            "gold_sql": example.gold_sql, "pipeline": pipeline, "policy": policy,
            "mode": "real", "session": session, "arrival_s": submitted}
    if answer is None:
        return {**base, "pred_sql": None, "status": "error", "error": error,
                **judge.judge(example, None), "latency_s": None, "idle_latency_s": None,
                "queue_s": 0.0, "run_s": 0.0, "slo_s": slo_s, "met_slo": None, "calls": 0,
                "prompt_tokens": 0, "completion_tokens": 0, "usage_by_stage": {},
                "stages": [], "query_id": None, "finish_s": None, "confidence": None}
    rows = stage_rows(answer.stages)
    verdict = judge.judge(example, answer.sql)
    if not answer.sql and answer.error:
        verdict["detail"] = f"{answer.status}: {answer.error}"  # why there is no SQL
    return {**base, "pred_sql": answer.sql, "status": answer.status, "error": answer.error,
            **verdict, "latency_s": answer.latency_s,
            "idle_latency_s": critical_path_s(rows) if rows else None,
            "queue_s": sum(r["queue_s"] for r in rows), "run_s": sum(r["run_s"] for r in rows),
            "slo_s": answer.slo_s, "met_slo": answer.met_slo, **usage_fields(answer.usage),
            "stages": rows, "query_id": answer.query_id,
            "confidence": getattr(answer, "confidence", None),
            "finish_s": finished if answer.status in ("done", "unsure", "failed") else None}
