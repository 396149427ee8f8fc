"""What a stage function sees: its query, its parents' outputs, the LLM, the pipeline's tools."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentflow.llm.base import LLMRequest, LLMResult, SamplingParams
from agentflow.workflow.graph import Expansion, Node, WorkflowRun
from agentflow.workflow.query import LLMCallRecord, Query
from agentflow.workflow.router import CallRouter, LLMCall


@dataclass
class StageContext:
    run: WorkflowRun
    node: Node
    router: CallRouter
    env: Any  # the pipeline's environment: database, retrieval tools, settings
    state: dict[str, Any]  # per-query blackboard shared by the pipeline's stages
    expansion: Expansion = field(default_factory=Expansion)
    summary: str = ""

    @property
    def query(self) -> Query:
        return self.run.query

    def input(self, node_id: str) -> Any:
        """Output of a finished node (usually a parent)."""
        return self.run.outputs[node_id]

    @property
    def parent_outputs(self) -> dict[str, Any]:
        return {p: self.run.outputs.get(p) for p in self.run.graph.predecessors(self.node.id)}

    def expand(self, nodes: list[Node], edges: list[tuple[str, str]]) -> None:
        """Grow the graph when this stage finishes (fan-out, another revision round)."""
        self.expansion.nodes.extend(nodes)
        self.expansion.edges.extend(edges)

    async def llm(self, prompt: str, params: SamplingParams | None = None, *,
                  answer_prefix: str = "") -> LLMResult:
        """One LLM call for this stage, routed (and, with a scheduler, queued and ranked)."""
        request = LLMRequest(prompt=prompt, params=params or SamplingParams(),
                             answer_prefix=answer_prefix, stage=self.node.stage,
                             query_id=self.query.id)
        outcome = await self.router.submit(LLMCall(request=request, run=self.run, node=self.node))
        result = outcome.result
        self.query.stage(self.node.id).llm_calls.append(LLMCallRecord(
            request_id=request.request_id, instance=outcome.instance, priority=outcome.priority,
            prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
            cached_prompt_tokens=result.cached_prompt_tokens, submitted=outcome.submitted,
            started=outcome.started, finished=outcome.finished,
            finish_reason=result.finish_reason, max_tokens=request.params.max_tokens,
            node=result.node, failed_attempts=list(getattr(outcome, "failed_attempts", ()))))
        trace = self.state.setdefault("_llm_texts", {})
        trace[request.request_id] = {"prompt": prompt + answer_prefix, "output": result.text}
        return result
