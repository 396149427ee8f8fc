"""Workloads for the simulator: recorded query DAGs and their arrival times.

Two trace formats import into one ``TraceQuery`` shape (a DAG of LLM calls with token counts
and tool steps with durations):

* HexGen-Flow traces — a JSON list of ``{"Text2SQLRequest": [{"step", "input_length",
  "output_length"}, ...]}``. As the reference simulator reads them: consecutive calls of
  ``generate_candidate_llama-agent`` form one stage whose calls run in parallel, so do
  consecutive ``evaluate`` calls; every other call is a stage of its own; each stage starts
  when the previous one has finished.
* agentflow traces — the JSONL written by ``--record`` (``agentflow.workflow.trace``): the DAG
  as it actually ran, with each LLM call's tokens and each tool step's duration.

A recorded DAG is the run's *end* state; serving saw it grow. Each node says whether the
pipeline built it up front (its shape) or added it at run time (``expanded``, with the stage
whose finish added it when the trace knows), so the simulator can show the scheduler only what
serving would have (``agentflow.sim.replay``). agentflow traces record it; in HexGen-Flow
traces a stage is part of the shape when every query of the CHESS traces runs it the same
number of times (``HEXGEN_SHAPE_STAGES``), anything else is taken as grown at run time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from agentflow.slo_classes import check_weight

PARALLEL_STEPS = ("generate_candidate_llama-agent", "evaluate")
# Stages of HexGen-Flow's CHESS that its pipeline always runs, the same number of times: in
# the shared trace1/trace2 (186 queries) every query has 4 ``Information Retriever`` calls, 2
# candidates and 3 ``unit_tester`` calls, while ``extract_keywords`` (0-1), ``revise`` (0-9),
# ``generate_unit_test`` (0-1) and ``evaluate`` (0-11) vary with what the run found. Only the
# former are known at arrival; a stage not named here (another trace's) is taken as grown at
# run time — the scheduler may know less than serving would, never more.
HEXGEN_SHAPE_STAGES = ("Information Retriever", "generate_candidate_llama-agent", "unit_tester")


@dataclass(frozen=True)
class TraceNode:
    id: str
    stage: str
    kind: str  # "llm" | "tool"
    parents: tuple[str, ...]
    prompt_tokens: int = 0
    output_tokens: int = 0
    duration_s: float = 0.0  # tool steps only
    # The call's output cap, when the trace recorded it (agentflow traces do; HexGen-Flow
    # traces do not): a setting of the pipeline, known to the scheduler before the call runs.
    max_tokens: int | None = None
    # The prompt's text, when the trace recorded it and the stage made exactly one call
    # (agentflow traces): what the prefix cache keys. HexGen-Flow traces carry none, and a
    # node without text never shares a prefix with anything in the simulator.
    prompt_text: str | None = field(default=None, repr=False, compare=False)
    # Added by the pipeline at run time (a revision round, the unit-test phase), not built at
    # arrival: the scheduler learns of it when ``expanded_by`` finishes, or — when the trace
    # does not say which stage added it — once its parents have finished.
    expanded: bool = False
    expanded_by: str | None = None


@dataclass
class TraceQuery:
    id: str
    nodes: list[TraceNode]
    question: str = ""  # what the length model embeds (empty for HexGen traces)
    meta: dict = field(default_factory=dict)

    @property
    def llm_calls(self) -> int:
        return sum(n.kind == "llm" for n in self.nodes)


def load_hexgen(path: str | Path) -> list[TraceQuery]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of queries (HexGen-Flow format)")
    queries = []
    for qi, item in enumerate(data):
        steps = item.get("Text2SQLRequest") if isinstance(item, dict) else None
        if not steps:
            raise ValueError(f"{path}: query {qi} has no Text2SQLRequest steps")
        nodes: list[TraceNode] = []
        previous: tuple[str, ...] = ()
        current: list[str] = []
        current_step = None
        for si, step in enumerate(steps):
            name = step["step"]
            joins = name in PARALLEL_STEPS and name == current_step
            if not joins and current:
                previous, current = tuple(current), []
            node_id = f"{si}:{name}"
            nodes.append(TraceNode(node_id, name, "llm", previous,
                                   int(step["input_length"]), int(step["output_length"]),
                                   expanded=name not in HEXGEN_SHAPE_STAGES))
            current.append(node_id)
            current_step = name
        queries.append(TraceQuery(id=f"{Path(path).stem}-{qi}", nodes=nodes))
    return queries


def load_agentflow(path: str | Path) -> list[TraceQuery]:
    queries = []
    with Path(path).open() as fh:
        for li, line in enumerate(fh):
            if not line.strip():
                continue
            rec = json.loads(line)
            nodes = []
            for n in rec["nodes"]:
                if n.get("status") not in ("ok", None):
                    continue  # stages that never finished are not replayed
                parents = tuple(p for p in n["parents"])
                # Traces written before ``expanded_by`` was recorded do not say which stages
                # the pipeline built up front: every stage is then taken as grown at run time.
                grown = {"expanded": n.get("expanded_by") is not None or "expanded_by" not in n,
                         "expanded_by": n.get("expanded_by")}
                if n["kind"] == "llm":
                    calls = n.get("calls") or []
                    caps = [c.get("max_tokens") for c in calls]
                    text = calls[0].get("prompt") if len(calls) == 1 else None
                    nodes.append(TraceNode(
                        n["id"], n["stage"], "llm", parents,
                        sum(c["prompt_tokens"] for c in calls),
                        sum(c["completion_tokens"] for c in calls),
                        max_tokens=sum(caps) if caps and None not in caps else None,
                        prompt_text=text if isinstance(text, str) and text else None, **grown))
                else:
                    duration = (n["end"] or 0.0) - (n["start"] or 0.0)
                    nodes.append(TraceNode(n["id"], n["stage"], "tool", parents,
                                           duration_s=max(0.0, duration), **grown))
            kept = {n.id for n in nodes}
            nodes = [replace(n, parents=tuple(p for p in n.parents if p in kept))
                     for n in nodes]
            queries.append(TraceQuery(id=f"{rec.get('query_id', li)}", nodes=nodes,
                                      question=rec.get("question", ""),
                                      meta={"db_id": rec.get("db_id"), "sql": rec.get("sql"),
                                            "status": rec.get("status")}))
    return queries


def load_trace(path: str | Path, fmt: str = "auto") -> list[TraceQuery]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    if fmt == "auto":
        fmt = "agentflow" if path.suffix == ".jsonl" else "hexgen"
    if fmt == "hexgen":
        return load_hexgen(path)
    if fmt == "agentflow":
        return load_agentflow(path)
    raise ValueError(f"unknown trace format {fmt!r}; expected hexgen or agentflow")


# ------------------------------------------------------------------------------ arrivals
def arrival_times(n: int, rate: float, process: str = "poisson", *, seed: int = 0
                  ) -> np.ndarray:
    """``n`` arrival times (seconds from 0) at mean ``rate`` queries/s.

    ``poisson``; ``gamma:CV`` (bursty: gamma inter-arrivals with coefficient of variation CV);
    ``steps:R1/D1,R2/D2,...`` (fluctuating: rate R1 for D1 seconds, then R2 for D2, cycling;
    ``rate`` is ignored) — each segment Poisson.
    """
    if n <= 0:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    if process == "poisson":
        return np.cumsum(rng.exponential(1.0 / _positive(rate), n))
    if process.startswith("gamma:"):
        cv = float(process.split(":", 1)[1])
        if cv <= 0:
            raise ValueError("gamma CV must be positive")
        shape = 1.0 / cv ** 2
        return np.cumsum(rng.gamma(shape, 1.0 / (_positive(rate) * shape), n))
    if process.startswith("steps:"):
        segments = []
        for part in process.split(":", 1)[1].split(","):
            rate_s, duration_s = part.split("/")
            segments.append((_positive(float(rate_s)), float(duration_s)))
        times: list[float] = []
        t, seg = 0.0, 0
        segment_end = segments[0][1]
        while len(times) < n:
            r, d = segments[seg % len(segments)]
            gap = rng.exponential(1.0 / r)
            if t + gap > segment_end:  # memoryless: restart at the next segment's rate
                t = segment_end
                seg += 1
                segment_end = t + segments[seg % len(segments)][1]
                continue
            t += gap
            times.append(t)
        return np.asarray(times)
    raise ValueError(f"unknown arrival process {process!r}; use poisson, gamma:CV or "
                     "steps:RATE/SECONDS,...")


@dataclass(frozen=True)
class TenantSpec:
    """One tenant of a simulated shared cluster
    (``--tenant NAME:RATE:SLO_SECONDS[:CLASS[:WEIGHT]]``): its own Poisson-or-other arrivals
    at ``rate``, its own deadline (None: the class's default, which for ``batch`` is none),
    SLO class and share weight (``scheduler.fairness``: tenants of weights 2 and 1 that both
    keep work waiting get instance time 2 : 1). Several of them on one cluster is what
    isolation and fairness are measured on."""

    name: str
    rate: float
    slo_s: float | None
    slo_class: str | None = None
    queries: int | None = None  # its own count (benchmarks); None: the run's --queries
    weight: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight", check_weight(self.weight, f"tenant {self.name!r}"))

    @classmethod
    def parse(cls, text: str) -> TenantSpec:
        """``NAME:RATE:SLO_SECONDS[:CLASS[:WEIGHT]]``; SLO ``none`` (or empty) for no deadline
        of its own, CLASS empty for the default class. A clear error names what is wrong."""
        parts = text.split(":")
        if len(parts) not in (3, 4, 5) or not parts[0]:
            raise ValueError(f"bad tenant {text!r}: expected "
                             "NAME:RATE:SLO_SECONDS[:CLASS[:WEIGHT]]")
        name, rate_s, slo_text = parts[:3]
        try:
            rate = float(rate_s)
        except ValueError:
            raise ValueError(f"bad tenant {text!r}: rate {rate_s!r} is not a number") from None
        if not rate > 0:
            raise ValueError(f"bad tenant {text!r}: rate must be positive")
        slo: float | None = None
        if slo_text.strip().lower() not in ("", "none", "-"):
            try:
                slo = float(slo_text)
            except ValueError:
                raise ValueError(f"bad tenant {text!r}: SLO {slo_text!r} is not a number "
                                 "(or 'none')") from None
            if not slo > 0:
                raise ValueError(f"bad tenant {text!r}: SLO seconds must be positive")
        slo_class = parts[3] if len(parts) >= 4 and parts[3] else None
        weight = 1.0
        if len(parts) == 5:
            weight = check_weight(parts[4], f"bad tenant {text!r}")
        return cls(name, rate, slo, slo_class, weight=weight)


def _positive(rate: float) -> float:
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    return rate
