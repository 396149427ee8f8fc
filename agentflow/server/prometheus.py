"""Prometheus metrics for ``GET /metrics``.

Each app gets its own registry (several servers in one process — tests, benchmarks — must
not share counters). Finished queries are observed once, from their answer; the cluster's
live state (queue lengths, calls in flight, instances up) is read from the coordinator at
scrape time rather than mirrored, so it cannot drift. Scheduler decision time is measured
around the coordinator's event handlers by an observer the service layer registers
(``service.DecisionTimer``, ``Coordinator.add_observer``), never by clock reads inside the
scheduler.

Label values come only from the server's configuration (instances, stages, SLO classes),
never straight from a request: every distinct value is a time series kept for the life of
the process, so a value a client could choose would let clients grow ``/metrics`` without
bound. A request naming an unknown SLO class is refused (400 ``unknown_slo_class``) before
it counts anywhere; a class name that reaches the counters by another way (a router driven
from Python, a class table changed at run time) is counted under ``UNKNOWN_CLASS``, one
series however many such names there are.
"""

from __future__ import annotations

from collections import Counter as Counter_
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agentflow.slo_classes import DEFAULT_CLASS, DEFAULT_SLO_CLASSES, UNKNOWN_CLASS

if TYPE_CHECKING:
    from agentflow.api import AgentFlow, Answer, QueryHandle
    from agentflow.scheduler.coordinator import Coordinator
    from agentflow.server.models import InstanceInfo

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
                    0.05, 0.1, 0.25)


class ServiceState(Protocol):
    """What the scrape-time gauges read from the query service (``server.service.
    QueryService``, which feeds these metrics): named here so that this module stays below
    the service instead of importing it back."""

    @property
    def af(self) -> AgentFlow: ...

    @property
    def coordinator(self) -> Coordinator | None: ...

    def instances(self) -> list[InstanceInfo]: ...

    def instance_reports(self) -> dict[str, dict[str, Any]] | None: ...


def class_label(name: str | None, classes: Collection[str]) -> str:
    """The ``slo_class`` label of a query of class ``name`` (None: the default class): the
    name if ``classes`` (the configured ones) has it, else ``UNKNOWN_CLASS``."""
    key = DEFAULT_CLASS if name is None else name
    return key if key in classes else UNKNOWN_CLASS


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.submitted = Counter("agentflow_queries_submitted", "Queries accepted for "
                                 "answering (before admission)", registry=r)
        self.queries = Counter("agentflow_queries", "Finished queries by final status "
                               "(done, unsure, failed, cancelled, rejected)", ["status"],
                               registry=r)
        self.slo = Counter("agentflow_slo_queries", "Finished queries that had an SLO, by "
                           "whether they were answered (status done) within it", ["met"],
                           registry=r)
        self.query_latency = Histogram("agentflow_query_latency_seconds", "End-to-end latency "
                                       "of answered queries", ["status"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.class_latency = Histogram("agentflow_class_query_latency_seconds", "End-to-end "
                                       "latency of answered queries by SLO class (whether "
                                       "a batch flood reaches interactive users)",
                                       ["slo_class", "status"], buckets=LATENCY_BUCKETS,
                                       registry=r)
        self.stage_latency = Histogram("agentflow_stage_latency_seconds", "Stage duration by "
                                       "stage type", ["stage", "kind"], buckets=LATENCY_BUCKETS,
                                       registry=r)
        self.call_queue = Histogram("agentflow_llm_call_queue_seconds", "LLM call time waiting "
                                    "in the scheduler's queues, by instance", ["instance"],
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.call_run = Histogram("agentflow_llm_call_run_seconds", "LLM call time running on "
                                  "the instance", ["instance"], buckets=LATENCY_BUCKETS,
                                  registry=r)
        self.call_failures = Counter("agentflow_llm_call_failures", "LLM call attempts an "
                                     "instance failed (then re-run elsewhere or failed)",
                                     ["instance"], registry=r)
        self.decision_seconds = Histogram("agentflow_scheduler_decision_seconds", "Time the "
                                          "coordinator spends handling one event, measured "
                                          "around it", ["event"], buckets=DECISION_BUCKETS,
                                          registry=r)
        self.http_errors = Counter("agentflow_http_errors", "Error responses by code",
                                   ["status", "code"], registry=r)
        self._slo_met = 0
        self._slo_total = 0
        # the configured SLO classes (labels any other class name maps away from)
        self.classes: Callable[[], Collection[str]] = lambda: DEFAULT_SLO_CLASSES

    def bind(self, service: ServiceState) -> None:
        coordinator = service.coordinator  # its table, where a router passed in code has one
        self.classes = lambda: {*service.af.config.scheduler.slo_classes,
                                *(coordinator.slo_classes if coordinator is not None else ())}
        self.registry.register(_ClusterCollector(service, self))

    def observe_answer(self, handle: QueryHandle, answer: Answer | None) -> None:
        status = answer.status if answer is not None else "failed"
        self.queries.labels(status=status).inc()
        slo = handle.slo_s
        if slo is not None:
            met = bool(answer is not None and answer.met_slo)  # agentflow.metrics' rule
            self.slo.labels(met=str(met).lower()).inc()
            self._slo_total += 1
            self._slo_met += met
        if answer is None:
            return
        if answer.latency_s is not None:
            self.query_latency.labels(status=status).observe(answer.latency_s)
            self.class_latency.labels(slo_class=class_label(handle.slo_class, self.classes()),
                                      status=status).observe(answer.latency_s)
        for stage in answer.stages:
            if stage.get("start") is not None and stage.get("end") is not None:
                self.stage_latency.labels(stage=stage["stage"], kind=stage["kind"]).observe(
                    max(0.0, stage["end"] - stage["start"]))
            for call in stage.get("llm_calls", []):
                self.call_queue.labels(instance=call["instance"]).observe(call["queue_s"])
                self.call_run.labels(instance=call["instance"]).observe(call["run_s"])

    def error(self, status: int, code: str) -> None:
        self.http_errors.labels(status=str(status), code=code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ClusterCollector:
    """Gauges read at scrape time from the coordinator and the service."""

    def __init__(self, service: ServiceState, metrics: ServerMetrics):
        self.service = service
        self.metrics = metrics

    def collect(self) -> Any:
        waiting = GaugeMetricFamily("agentflow_instance_waiting_calls",
                                    "LLM calls waiting in the instance's queue",
                                    labels=["instance"])
        running = GaugeMetricFamily("agentflow_instance_inflight_calls",
                                    "LLM calls running on the instance", labels=["instance"])
        up = GaugeMetricFamily("agentflow_instance_up", "1 if the instance takes calls, 0 "
                               "while it is down after a failure", labels=["instance"])
        placed = GaugeMetricFamily("agentflow_instance_placement", "1 per instance hosted "
                                   "by a Ray actor, labelled with its node and GPUs",
                                   labels=["instance", "node", "gpu", "gpu_ids"])
        restarts = CounterMetricFamily("agentflow_instance_restarts", "Times Ray restarted "
                                       "the instance's actor", labels=["instance"])
        for info in self.service.instances():
            waiting.add_metric([info.name], info.waiting)
            running.add_metric([info.name], info.running)
            up.add_metric([info.name], 1 if info.up else 0)
            if info.node is not None:
                placed.add_metric([info.name, info.node, info.gpu or "",
                                   ",".join(info.gpu_ids or [])], 1)
                restarts.add_metric([info.name], info.restarts or 0)
        yield from (waiting, running, up, placed, restarts)
        yield from self._health()
        coord = self.service.coordinator
        active = GaugeMetricFamily("agentflow_active_queries", "Queries admitted and not "
                                   "finished")
        active.add_metric([], len(coord.queries) if coord is not None else
                          sum(1 for h in list(self.service.af.handles.values()) if not h.done()))
        yield active
        m = self.metrics
        attainment = GaugeMetricFamily("agentflow_slo_attainment_ratio", "Share of finished "
                                       "queries with an SLO that were answered within it "
                                       "(since start; NaN before the first)")
        attainment.add_metric([], m._slo_met / m._slo_total if m._slo_total else float("nan"))
        yield attainment

    def _health(self) -> Any:
        """Instance health and what the router did about late or failing calls: from this
        process's coordinators, or the scheduler process's report (``--replicas N``)."""
        reports = self.service.instance_reports()
        if reports is None:
            return
        state = GaugeMetricFamily("agentflow_instance_health", "1 for the instance's current "
                                  "health state (healthy, suspect, down, probing)",
                                  labels=["instance", "state"])
        opened = CounterMetricFamily("agentflow_instance_outages", "Times the instance was "
                                     "taken out of service (died, circuit opened, timed out)",
                                     labels=["instance"])
        probes = CounterMetricFamily("agentflow_instance_probes", "Probe calls to an instance "
                                     "out of service, by result", labels=["instance", "result"])
        for name, r in reports.items():
            for s in ("healthy", "suspect", "down", "probing"):
                state.add_metric([name, s], 1.0 if r["health"] == s else 0.0)
            opened.add_metric([name], r["outages"])
            probes.add_metric([name, "ok"], r["probes_ok"])
            probes.add_metric([name, "failed"], r["probes_failed"])
        timeouts = CounterMetricFamily("agentflow_llm_call_timeouts", "LLM calls cancelled on "
                                       "an instance: past their deadline or stalled",
                                       labels=["instance", "kind"])
        retries = CounterMetricFamily("agentflow_llm_call_retries", "LLM calls re-dispatched "
                                      "after failing, timing out or being moved off the "
                                      "instance", labels=["instance"])
        preempted = CounterMetricFamily("agentflow_llm_call_preemptions", "LLM call attempts "
                                        "stopped on the instance for a better class "
                                        "(scheduler.preemption) and re-queued, by the stopped "
                                        "call's SLO class; not failures, timeouts or retries",
                                        labels=["instance", "slo_class"])
        configured = self.metrics.classes()
        stopped: Counter_[tuple[str, str]] = Counter_()
        for name, r in reports.items():
            for cls, n in r["preempted"].items():
                stopped[name, class_label(cls, configured)] += n
        classes = sorted({*configured, *(k[1] for k in stopped)})
        for name, r in reports.items():
            timeouts.add_metric([name, "deadline"], r["timeouts"])
            timeouts.add_metric([name, "stalled"], r["stalled"])
            retries.add_metric([name], r["retried"])
            for cls in classes:
                preempted.add_metric([name, cls], stopped.get((name, cls), 0))
        yield from (state, opened, probes, timeouts, retries, preempted)
