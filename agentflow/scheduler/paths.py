"""What is left of a query, as the scheduler predicts it: its remaining critical paths
(expected, optimistic and pessimistic) and its remaining cost distribution.

Deadline budgets (urgency, llf, flowsage) need the longest chain of expected stage times
after a call, and Gittins-style ranks need the distribution of the query's remaining cost.
Both are priced from what serving knows: a stage with a call uses the call's predicted
length; a stage the pipeline has expanded but not yet reached uses the length model and the
stage's prompt sizes seen so far (``_future_lengths``); only the oracle length model knows
true sizes. Times are the cluster-mean linear time model (``ClusterView._mean_coefs``),
since a future stage's instance is not chosen yet.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import networkx as nx
import numpy as np

from agentflow.scheduler.call import CallState, QueryState, ScheduledCall
from agentflow.scheduler.distribution import Distribution, cost_distribution, kv_cost
from agentflow.scheduler.lengths.base import LengthModel
from agentflow.scheduler.view import ClusterView
from agentflow.workflow.graph import Node, NodeKind, WorkflowRun, generation_order

if TYPE_CHECKING:
    from agentflow.scheduler.policies.base import QueuePolicy
    from agentflow.workflow.clock import Clock

# Prompt tokens assumed for a future stage when neither its pipeline hints nor any earlier
# call of its stage says more.
DEFAULT_PROMPT_TOKENS = 500
# Joint samples behind a query's remaining-cost distribution (``_sum_by_sampling``).
_COST_SAMPLES = 256


class WorkflowPaths(ClusterView):
    # quantile levels of the optimistic and pessimistic paths (a symmetric 80% band)
    PATH_QUANTILES: ClassVar[tuple[float, float]] = (0.1, 0.9)

    # Set by the coordinator: the lengths it predicts with, and the queue policy whose
    # ``query_dependent`` says whether paths are kept current at events.
    length_model: LengthModel
    _queue_policy: QueuePolicy
    clock: Clock
    queries: dict[str, QueryState]

    def _init_paths(self) -> None:
        # per query: stage -> predicted length (future stages), and its (mean, P10, P90)
        self._stage_prediction: dict[str, dict[str, Distribution]] = {}
        self._stage_summary: dict[str, dict[str, tuple[Distribution, tuple[Any, ...]]]] = {}
        # Mean prompt tokens of each stage's calls so far: the estimate for future calls of
        # the stage when the pipeline gives no hint (what serving knows before a prompt exists).
        self._stage_prompts: dict[str, tuple[float, int]] = {}
        # whether a put-off pass (``_defer_paths``) holds the dict above: then it is copied
        # before it changes, so the pass reads what it would have read when it was put off
        self._prompts_held = False

    def _note_prompt(self, stage: str, prompt_tokens: int) -> None:
        """A call of ``stage`` is ready with this prompt: fold it into the stage's mean."""
        prompts = self._stage_prompts
        if self._prompts_held:
            prompts = self._stage_prompts = dict(prompts)
            self._prompts_held = False
        mean, n = prompts.get(stage, (0.0, 0))
        prompts[stage] = (mean + (prompt_tokens - mean) / (n + 1), n + 1)

    def _forget_query(self, query_id: str) -> None:
        self._stage_prediction.pop(query_id, None)
        self._stage_summary.pop(query_id, None)

    def downstream_s(self, call: ScheduledCall, now: float) -> float:
        """Expected seconds on the longest chain after ``call``'s stage, as of the query's
        last event (see ``Coordinator._refresh``)."""
        if call.query.run is None:
            return 0.0
        self._paths_on_demand(call.query, now)
        return call.query.path_cache.get(call.node_id, 0.0)

    def remaining_s(self, query: QueryState, now: float) -> float:
        """Expected seconds left on the query's critical path, as of its last event."""
        if query.run is not None:
            self._paths_on_demand(query, now)
            return query.path_cache.get(None, 0.0)
        return sum(self._mean_time(c.prompt_tokens, c.mean_output) for c in query.calls)

    def _paths_on_demand(self, query: QueryState, now: float) -> None:
        """Policies that keep no per-query state (fcfs, edf, gittins) skip the critical
        paths at events; asked for them anyway (inspection, tests), compute them now. A
        pass a progress report put off (``_defer_paths``) is made now, as of the report."""
        if not self._queue_policy.query_dependent:
            self._critical_paths(query, now)
        elif query.paths_due is not None:
            self._settle(query)

    # ------------------------------------------------------------ put-off passes
    # A running call's progress report re-prices its query (its elapsed time moves the
    # remaining paths), but nothing reads those paths unless the query has a call waiting
    # in a queue, or someone asks before the query's next event (which makes its own pass
    # and overwrites them). On a large fleet almost no query has a call waiting, and the
    # reports are most of the events, so the pass is put off: what it would read — the
    # time, the cluster-mean coefficients, the stage prompt means — is kept, and the pass
    # runs on them only if the paths are read before the next event. The run, the
    # query's calls and its finished stages cannot have changed meanwhile (``_paths_stamp``
    # says; a runtime that moves a run outside the coordinator's events calls
    # ``settle_paths`` first), so the deferred pass gives the same floats as the eager one.

    @staticmethod
    def _paths_stamp(query: QueryState) -> tuple[Any, ...]:
        """What the DP reads besides time, coefficients and prompt means, as counters."""
        run = query.run
        return (run.version if run is not None else None, query.calls_version,
                len(query.calls), len(query.done_nodes))

    def _defer_paths(self, query: QueryState, now: float, stamp: tuple[Any, ...]) -> bool:
        """Put off the pass a progress report asks for (see above); False when it must run
        now: the query has a call waiting in a queue (its key moves with the paths), or
        the paths were last computed on another run state than ``stamp`` says (the stamp
        before the report's own ``calls_version`` bump)."""
        if query.run is None or query.paths_stamp != stamp:
            return False
        for c in query.calls:
            if c.instance is not None and c.state == CallState.WAITING:
                return False
        query.paths_stamp = self._paths_stamp(query)
        query.paths_due = (now, self._mean_coefs(), self._stage_prompts, query.paths_stamp)
        self._prompts_held = True
        return True

    def _settle(self, query: QueryState) -> None:
        """Make the put-off pass: as of its report when nothing moved since (the same
        floats as making it then), else — a runtime moved the run without saying — now."""
        due = query.paths_due
        if due is None:
            return
        t, coefs, prompts, stamp = due
        if stamp == self._paths_stamp(query):
            self._critical_paths(query, t, coefs, prompts)
        else:
            self._critical_paths(query, self.clock.now())

    def settle_paths(self, query_id: str) -> None:
        """A runtime about to change a query's run outside the coordinator's events (a tool
        step starting or finishing: no call, so no event) calls this first, so a pass a
        progress report put off is made on the run as the report found it."""
        query = self.queries.get(query_id)
        if query is not None and query.paths_due is not None:
            self._settle(query)

    def _critical_paths(self, query: QueryState, now: float,
                        coefs: tuple[float, float, float] | None = None,
                        prompts: dict[str, tuple[float, int]] | None = None) -> None:
        """Downstream critical path of every unfinished stage, and (key ``None``) of the
        whole remaining workflow, by one DP over a cached topological order: a stage the
        scheduler saw finish counts as done even before the runtime marks it, a running
        stage counts its expected remainder. The same pass gives the optimistic and
        pessimistic whole paths (every LLM stage at its P10 / P90 length) and the work left.

        The order is pruned as stages finish: a finished stage never runs again (states
        only move forward, and the graph only grows), so it is dropped from the cached
        order and from its parents' successor lists; it would have been skipped anyway,
        so the DP visits the same unfinished stages in the same order (same floats) but no
        longer walks a long query's whole history at every event.

        ``coefs`` and ``prompts``: the cluster-mean coefficients and stage prompt means to
        price with (a put-off pass: ``_defer_paths``); None: the current ones."""
        run = query.run
        assert run is not None  # callers compute paths only for queries with a workflow
        graph = run.graph
        shape = len(graph)  # the graph only grows, and only by new nodes (expansions)
        if query.topo is None or query.topo[0] != shape:
            order: list[str] = generation_order(graph)  # nx.topological_sort's list
            if _DICT_REBUILD and type(run) is WorkflowRun and type(graph) is nx.DiGraph:
                # ``run.node`` and ``graph.successors`` read from the graph's own dicts
                # (``graph.nodes[n]`` is ``graph._node[n]``; successors iterate
                # ``graph._succ[n]``): the same lists without a view and an iterator per
                # node (a pass after an expansion rebuilds the whole order: ~20% of the
                # passes at 1,500 queries on hetero-1024, ~75 us each)
                attrs, succ = graph._node, graph._succ
                query.topo = (shape, [(n, attrs[n]["node"], list(succ[n]))
                                      for n in reversed(order)])
            else:
                query.topo = (shape, [(n, run.node(n), list(graph.successors(n)))
                                      for n in reversed(order)])
        _, reverse_order = query.topo
        oh, pf, df = self._mean_coefs() if coefs is None else coefs
        calls = {c.node_id: c for c in query.calls}
        done = query.done_nodes
        # a WorkflowRun's own state dict (one lookup per stage, not a method call), or a
        # shard's mirror of one
        started_of: Callable[[str], float | None]
        if type(run) is WorkflowRun:
            state_of, started_of = run._state.__getitem__, run._started_at.get
        else:
            state_of, started_of = run.state, run.started_at
        pending, running, llm = run.PENDING, run.RUNNING, NodeKind.LLM
        # Future stages (``_stage_lengths``) inline, with what it looks up once per stage
        # looked up once per pass: only the oracle knows true sizes (then the method itself
        # runs), the stage prompt means, the query's predictions and their summaries.
        knows = type(self.length_model).true_lengths is not LengthModel.true_lengths
        stage_prompts = self._stage_prompts if prompts is None else prompts
        predicted = self._stage_prediction.get(query.id)
        summaries = self._stage_summary.get(query.id)
        # per unfinished stage: its time plus the longest chain after it (expected, P10, P90),
        # what a parent's chain through it is (the sums are made once, here, not per edge)
        through: dict[str, tuple[float, float, float]] = {}
        after: dict[str | None, float] = {}
        total = total_lo = total_hi = work = 0.0
        finished = 0
        prompt: int
        for n, node, succ in reverse_order:
            state = state_of(n)
            if (state != pending and state != running) or n in done:
                finished += 1
                continue
            if node.kind == llm:
                call = calls.get(n)
                if call is not None:  # the common case: its call's prediction
                    prompt, summary = call.prompt_tokens, call.length_summary
                    if summary is None:
                        summary = call.length_summary = _length_summary(call.output)
                elif knows:
                    prompt, summary = self._stage_lengths(query, node, None, prompts)
                else:  # ``_stage_lengths`` of a future stage, as it computes it
                    stage, hints = node.stage, node.hints
                    hinted = hints.get("prompt_tokens")
                    if hinted is None:
                        seen = stage_prompts.get(stage)
                        hinted = seen[0] if seen is not None else DEFAULT_PROMPT_TOKENS
                    prompt = int(hinted)
                    dist = predicted.get(stage) if predicted is not None else None
                    if dist is None:
                        dist = self._predict_stage(query, stage, prompt, hints.get("max_tokens"))
                        predicted = self._stage_prediction[query.id]
                    if summaries is None:
                        summaries = self._stage_summary[query.id] = {}
                    kept = summaries.get(stage)
                    if kept is None or kept[0] is not dist:
                        kept = summaries[stage] = (dist, _length_summary(dist))
                    summary = kept[1]
                mean, lo, hi = summary
                base = oh + prompt * pf
                t, t_lo, t_hi = base + mean * df, base + lo * df, base + hi * df
                work += t
            elif knows:
                t = t_lo = t_hi = self._tool_time(query, node)
            else:  # ``_tool_time`` without a truth to read
                t = t_lo = t_hi = max(0.0, float(node.expected_s))
            if state == running:
                started = started_of(n)
                if started is not None:
                    elapsed = now - started
                    t = max(0.0, t - elapsed)
                    t_lo = max(0.0, t_lo - elapsed)
                    t_hi = max(0.0, t_hi - elapsed)
            best = best_lo = best_hi = 0.0
            for child in succ:
                r = through.get(child)
                if r is not None:
                    if r[0] > best:
                        best = r[0]
                    if r[1] > best_lo:
                        best_lo = r[1]
                    if r[2] > best_hi:
                        best_hi = r[2]
            after[n] = best
            chain = through[n] = (t + best, t_lo + best_lo, t_hi + best_hi)
            if chain[0] > total:
                total = chain[0]
            if chain[1] > total_lo:
                total_lo = chain[1]
            if chain[2] > total_hi:
                total_hi = chain[2]
        if finished:  # drop the finished stages: every later pass would skip them again
            query.topo = (shape, [(n, node, [c for c in succ if c in through])
                                  for n, node, succ in reverse_order if n in through])
        after[None] = total
        query.path_cache = after
        query.path_lo, query.path_hi, query.work_left = total_lo, total_hi, work
        query.paths_stamp = self._paths_stamp(query)
        query.paths_due = None

    def _tool_time(self, query: QueryState, node: Node) -> float:
        truth = self.length_model.true_lengths(query.id, node.id)
        if truth is not None and truth.duration_s is not None:
            return truth.duration_s
        return max(0.0, float(node.expected_s))

    def _stage_lengths(self, query: QueryState, node: Node, call: ScheduledCall | None,
                       prompts: dict[str, tuple[float, int]] | None = None
                       ) -> tuple[int, tuple[float, float, float]]:
        """(prompt tokens, (mean, P10, P90) output tokens) of an LLM stage: its call's
        when it has one, else what ``_future_lengths`` expects (``prompts``: the stage
        prompt means to read; None: the current ones)."""
        if call is not None:
            if call.length_summary is None:
                call.length_summary = _length_summary(call.output)
            return call.prompt_tokens, call.length_summary
        truth = self.length_model.true_lengths(query.id, node.id)
        if truth is not None:  # the oracle: this stage's real sizes
            o = float(truth.output_tokens)
            return truth.prompt_tokens, (o, o, o)
        # _future_lengths inline (this runs for every future stage at every event): the
        # same prompt and the same cached prediction, in fewer calls
        stage, hints = node.stage, node.hints
        prompt = hints.get("prompt_tokens")
        if prompt is None:
            seen = (self._stage_prompts if prompts is None else prompts).get(stage)
            prompt = seen[0] if seen is not None else DEFAULT_PROMPT_TOKENS
        prompt = int(prompt)
        predicted = self._stage_prediction.get(query.id)
        dist = predicted.get(stage) if predicted is not None else None
        if dist is None:
            dist = self._predict_stage(query, stage, prompt, hints.get("max_tokens"))
        per_query = self._stage_summary.get(query.id)
        if per_query is None:
            per_query = self._stage_summary[query.id] = {}
        summary = per_query.get(stage)
        if summary is None or summary[0] is not dist:
            summary = per_query[stage] = (dist, _length_summary(dist))
        return prompt, summary[1]

    def call_cost(self, call: ScheduledCall) -> Distribution:
        if call.cost is None:
            call.cost = cost_distribution(call.prompt_tokens, call.output)
        return call.cost

    def remaining_cost(self, query: QueryState) -> Distribution:
        """Distribution of the summed cost of the query's unfinished LLM stages.

        Built by Monte Carlo (a fixed number of joint samples, seeded by the query id so runs
        are reproducible) rather than by convolving ~20 distributions, and cached until the
        workflow or one of its calls changes."""
        version = (query.run.version if query.run is not None else None, query.calls_version)
        if query.remaining_cost is not None and query.remaining_cost_version == version:
            return query.remaining_cost
        by_node = {c.node_id: c for c in query.calls}
        parts: list[Distribution] = []
        if query.run is not None:
            for node in query.run.unfinished():
                if node.kind != NodeKind.LLM:
                    continue
                call = by_node.get(node.id)
                if call is not None:
                    parts.append(self._remaining_call_cost(call))
                else:
                    parts.append(cost_distribution(*self._future_lengths(query, node)))
        else:
            parts = [self._remaining_call_cost(c) for c in query.calls]
        total = _sum_by_sampling(parts, query.id)
        query.remaining_cost, query.remaining_cost_version = total, version
        return total

    def _remaining_call_cost(self, call: ScheduledCall) -> Distribution:
        cost = self.call_cost(call)
        if call.attained_tokens <= 0:
            return cost
        attained = kv_cost(call.prompt_tokens, call.attained_tokens)
        if cost.survival(attained) <= 0:
            return Distribution.point(0.0)
        return cost.conditional_above(attained).shift(-attained)

    def _future_lengths(self, query: QueryState, node: Node, truth: Any = False
                        ) -> tuple[int, Distribution]:
        """Prompt tokens and output distribution of an LLM stage that has no call yet, from
        what serving knows: the length model (the oracle knows the truth), the node's
        ``max_tokens``, and its prompt size from the pipeline's hint, else the stage's
        calls so far, else ``DEFAULT_PROMPT_TOKENS``. ``truth``: the length model's true
        lengths of the node, where the caller has just asked (False: ask)."""
        if truth is False:
            truth = self.length_model.true_lengths(query.id, node.id)
        if truth is not None:
            return truth.prompt_tokens, Distribution.point(truth.output_tokens)
        prompt = node.hints.get("prompt_tokens")
        if prompt is None:
            seen = self._stage_prompts.get(node.stage)
            prompt = seen[0] if seen is not None else DEFAULT_PROMPT_TOKENS
        prompt = int(prompt)
        return prompt, self._predict_stage(query, node.stage, prompt, node.hints.get("max_tokens"))

    def _predict_stage(self, query: QueryState, stage: str, prompt_tokens: int | None = None,
                       max_tokens: int | None = None) -> Distribution:
        per_query = self._stage_prediction.setdefault(query.id, {})
        dist = per_query.get(stage)
        if dist is None:
            dist = per_query[stage] = self.length_model.predict(
                stage, query.key_text, prompt_tokens, max_tokens=max_tokens)
        return dist


# ``_critical_paths`` reads a grown graph's order from its dicts (False: through ``run.node``
# and ``graph.successors``, as before; tests compare the two)
_DICT_REBUILD = True

_QUANTILE_LEVELS = np.array(WorkflowPaths.PATH_QUANTILES) - 1e-12  # as Distribution.quantile


def _length_summary(dist: Distribution) -> tuple[float, float, float]:
    """(mean, P10, P90) of a length distribution (``Distribution.quantile``'s lower quantile,
    in one search)."""
    values = dist.values
    lo, hi = dist._cdf_array().searchsorted(_QUANTILE_LEVELS, side="left").tolist()
    last = values.size - 1
    return float(dist.mean()), float(values[min(lo, last)]), float(values[min(hi, last)])


def _sum_by_sampling(parts: list[Distribution], seed_text: str) -> Distribution:
    if not parts:
        return Distribution.point(0.0)
    if len(parts) == 1:
        return parts[0]
    rng = np.random.default_rng(zlib.crc32(seed_text.encode()))
    total = np.zeros(_COST_SAMPLES)
    for part in parts:
        total += part.sample(rng, _COST_SAMPLES)
    return Distribution.from_samples(total)
