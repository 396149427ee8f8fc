"""The scheduler's view of queries and LLM calls."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from agentflow.scheduler.distribution import Distribution

if TYPE_CHECKING:
    from agentflow.scheduler.ranking import Key
    from agentflow.workflow.graph import WorkflowRun

_seq = itertools.count()


class CallState(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(eq=False)
class QueryState:
    """What the scheduler tracks per query: its deadline and its live workflow."""

    id: str
    arrival: float
    deadline: float | None
    key_text: str = ""  # what the length model embeds (the question)
    slo_class: str | None = None  # agentflow.slo_classes name; None: the default class
    tenant: str | None = None  # who asked; None: anonymous
    run: WorkflowRun | None = None
    calls: set[ScheduledCall] = field(default_factory=set)
    calls_version: int = 0  # bumped when a call is added, finishes or crosses a bucket
    # flowsage: cached distribution of the query's remaining workflow cost
    remaining_cost: Distribution | None = None
    remaining_cost_version: tuple[Any, ...] | None = None
    # Critical-path lengths by node, valid for one workflow version (see Coordinator).
    path_cache: dict[str | None, float] = field(default_factory=dict)
    # The remaining critical path with every unfinished LLM stage at a low / high quantile
    # of its predicted length (optimistic / pessimistic), and the expected LLM seconds left
    # summed over all unfinished stages (the query's remaining work, parallel stages added).
    path_lo: float = 0.0
    path_hi: float = 0.0
    work_left: float = 0.0
    done_nodes: set[str] = field(default_factory=set)  # stages whose call finished
    topo: tuple[Any, ...] | None = field(default=None, repr=False)  # cached topological order
    # What the paths above were computed from (``WorkflowPaths._paths_stamp``), and a pass
    # a progress report put off: (time, mean coefficients, stage prompts, stamp) or None
    paths_stamp: tuple[Any, ...] | None = field(default=None, repr=False)
    paths_due: tuple[Any, ...] | None = field(default=None, repr=False)


@dataclass(eq=False)
class ScheduledCall:
    """One LLM call from ready to done. ``output`` is the predicted output-length
    distribution (a point at the truth only under the oracle length model)."""

    id: str
    query: QueryState
    stage: str
    node_id: str
    prompt_tokens: int
    output: Distribution
    ready_at: float
    payload: Any = None  # the runtime's own handle (asyncio future, simulator record)
    seq: int = field(default_factory=lambda: next(_seq))
    state: CallState = CallState.WAITING
    instance: str | None = None
    attained_tokens: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    priority: int = 0
    attempts: int = 0
    preemptions: int = 0  # times it was stopped for a better class (scheduler.preemption)
    co_runners_at_start: int = 0  # calls its instance was running when it was admitted
    share_charge: float = 0.0  # tenant virtual time its admission added (fairness; refunded)
    prefill_ahead_at_start: float = 0.0  # prompt tokens admitted there and not yet prefilled
    # its instance's ``InstanceQueue.prefilled_tokens`` at its first token (None: none yet)
    prefilled_mark: float | None = None
    kv_reserved: int = 0  # KV tokens its instance holds for it (grows if it outgrows that)
    excluded: set[str] = field(default_factory=set)  # instances that failed this call
    mean_output: float = field(init=False)
    cost: Distribution | None = field(default=None, repr=False)  # O^2/2 + I*O, cached
    # expected run time per instance, tagged with the time model's observation count
    time_cache: dict[str, tuple[int, float]] = field(default_factory=dict, repr=False)
    # queue ranking (InstanceQueue): the key it is ordered by
    rank_key: Key = field(default=(), repr=False)
    expected_finish: float | None = field(default=None, repr=False)  # estimated at admission
    # its entry in the load book's expiry wheel (``loadbook.ExpiryWheel``) while counted
    expiry_ticket: int | None = field(default=None, repr=False)
    length_summary: tuple[float, float, float] | None = field(default=None, repr=False)
    # The prompt's length on instances whose tokenizer counts it differently (other models).
    prompt_tokens_on: dict[str, int] | None = field(default=None, repr=False)
    # Chained hashes of the prompt's full blocks (``prefix_index.block_hashes``) and the
    # prompt's pseudo-token count, when the runtime passed the prompt text; else empty.
    prefix_hashes: tuple[bytes, ...] = field(default=(), repr=False)
    prefix_pseudo_tokens: int = field(default=0, repr=False)
    max_tokens: int | None = None  # its output cap, when the runtime gave one
    # (output, attained tokens, max tokens, expected_residual of them): what
    # ``remaining.remaining_s`` last conditioned on, kept (a pure function of the three)
    residual_memo: tuple[Any, ...] | None = field(default=None, repr=False)

    def prefix_tokens(self, blocks: int) -> int:
        """The prompt tokens ``blocks`` leading hashed blocks cover (trace/tokenizer units)."""
        if blocks <= 0 or not self.prefix_pseudo_tokens:
            return 0
        from agentflow.scheduler.prefix_index import BLOCK_TOKENS

        share = min(1.0, blocks * BLOCK_TOKENS / self.prefix_pseudo_tokens)
        return min(int(share * self.prompt_tokens), max(0, self.prompt_tokens - 1))

    def __post_init__(self) -> None:
        self.mean_output = float(self.output.mean())

    @property
    def deadline(self) -> float | None:
        return self.query.deadline

    def tokens_on(self, instance: str | None) -> int:
        """Prompt tokens as ``instance``'s tokenizer counts them."""
        if self.prompt_tokens_on is None or instance is None:
            return self.prompt_tokens
        return self.prompt_tokens_on.get(instance, self.prompt_tokens)
