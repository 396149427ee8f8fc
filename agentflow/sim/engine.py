"""A simulated GPU instance with vLLM-like continuous batching, in virtual time.

``SimInstance`` replays what a vLLM (V1) engine does with the requests a coordinator admits:
iteration-level scheduling over a paged KV cache, chunked prefill, priority order and
preemption by recomputation; only the clock is simulated. Nothing reads the wall clock and
nothing is random, so the same calls in the same order give the same events.

Scheduling, one iteration (vLLM V1, ``--scheduling-policy priority``)
-------------------------------------------------------------------
* Token budget ``max_num_batched_tokens``. Running sequences first, in admission order: each
  asks for all of its uncomputed tokens (1 when decoding; the rest of its prompt when it is
  prefilling), cut to the budget left (chunked prefill). A sequence that needs a KV block when
  none is free preempts the running sequence with the largest priority value (ties: latest
  arrival), possibly itself: its blocks are freed and it goes back to the waiting queue with
  its progress reset, to prefill prompt + generated tokens again (recompute mode).
* If nothing was preempted, waiting sequences are admitted in (priority, arrival) order while
  the budget, ``max_num_seqs`` and free blocks allow; the first that does not fit stops
  admission (no skipping ahead). Without chunked prefill a prompt is admitted only whole.
* A sequence whose uncomputed tokens are all computed in an iteration samples one token.
  A preempted sequence re-enters the queue at its (priority, arrival) position, which is the
  front among its own priority class.
* ``cached_tokens`` (prefix-cache hits) skip prefill compute on first admission; like vLLM
  only whole blocks count, and at least one prompt token is always computed.

Automatic prefix caching (a request added with ``prefix_hashes``)
----------------------------------------------------------------
vLLM's APC over the same paged cache: a prompt's full blocks are keyed by chained hashes
(``agentflow.scheduler.prefix_index.block_hashes``). At each admission (first or after a
preemption) the leading blocks found in the cache skip prefill (whole blocks, at least one
prompt token computed); the admitted sequence then holds all of its prompt's blocks (reference
counted: not evictable while any running sequence holds them). When it finishes, is aborted or
preempted its blocks become evictable, tail first (vLLM frees in reverse order), and stay in
the free pool's LRU until a new allocation needs the memory: the evictable set never exceeds
the free blocks. Simplifications, stated: a prompt's blocks count as cached from its
admission (vLLM V1 marks them as their chunk is scheduled, so a same-step sibling may hit a
few blocks early here); two running sequences sharing blocks each count them against memory
(vLLM stores them once), which under-states free memory under heavy sharing; generated tokens
are never keyed (no text for them). Requests without hashes (every HexGen-Flow trace) take the
path above unchanged.

KV-cache capacity
-----------------
``hardware.kv_cache_blocks``: GPU memory at ``gpu_memory_utilization`` less the weights and
the activation peak of a full step, in blocks of ``block_size`` tokens (serving reads the
same formula for the coordinator's KV budget).

Step time (the sum of the step's operators, ``agentflow.step_time``)
--------------------------------------------------------------------
An iteration computing ``T`` tokens over ``S`` sequences, where sequence ``i`` computes
``n_i`` tokens on top of ``c_i`` tokens already in its KV cache, takes, per layer, the four
GEMMs at ``T`` tokens + the element-wise operators and the KV-cache write at ``T`` tokens +
one decode-attention kernel over the sequences with ``n_i = 1`` (reading ``sum(c_i + 1)``
KV tokens) + one prefill-attention kernel over the others (``sum(n_i c_i + n_i (n_i+1)/2)``
query-key pairs); times the layers, plus the LM head at ``S`` rows, the tensor-parallel
all-reduces and ``step_overhead_s``. Each operator is ``latency + max(FLOPs / (peak *
efficiency), bytes / (bandwidth * efficiency))`` with its class's constants
(``hardware.GPUProfile``, fitted by ``agentflow bench fit_operators``). Operators run one after
another, so their times add: a prefill chunk beside a batch of long-context decodes costs its
GEMMs on top of the decodes' KV reads, as on a GPU. A decode step reads the weights once for
the whole batch (batch 32 costs far less than 32 single steps) but each sequence adds its
KV reads (batch 32 costs more than one). A mixture-of-experts MLP reads the fraction
``1 - (1 - active/total)^T`` of its expert weights.

The per-step token budget ``max_num_batched_tokens`` defaults to vLLM V1's for the GPU
(``hardware.default_max_num_batched_tokens``: 2048 on A100s and GPUs under 70 GiB, 8192 on
H100/H200).

Requests also pay ``request_overhead_s`` (HTTP, tokenisation) before they can be scheduled;
it counts as queue time. Measured from a fitted profile (``hardware.CALIBRATIONS``).

Jumping ahead
-------------
When an iteration is pure decode of every running sequence and nothing can be admitted, the
batch stays the same until a sequence finishes, a KV block runs out, or a new request
becomes eligible; ``K`` such iterations are planned at once (their times from one vectorised
roofline with the contexts growing by one token per step) and committed lazily, emitting
first-token / power-of-two progress / finish events at the exact iteration ends. An ``add``
or ``abort`` cuts the plan after the iteration in flight. ``jump_ahead=False`` plans one
iteration at a time; both give identical times (same integer operands, same float order).

Driving it
----------
``add(..., now)`` and ``abort(..., now)`` first run every iteration ending at or before
``now`` (events are kept for the next ``step_until``). ``next_event_time()`` is the end of
the iteration in flight or, inside a planned decode run, the next iteration that emits an
event (so a driver is not woken for silent decode steps); ``step_until(t)`` runs every
iteration ending at or before ``t`` and returns the events in time order.
"""

from __future__ import annotations

import heapq
import operator
import weakref
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import accumulate

import numpy as np

from agentflow import hardware
from agentflow.hardware import GPUProfile, ModelProfile
from agentflow.llm.llama_batches import Piece, SlotTable, fill_key
from agentflow.sim.llama_batches import decode_run_seconds, iteration_seconds
from agentflow.step_time import OperatorModel, StepShape, step_sums

_WAITING, _PENDING, _RUNNING, _DONE, _ABORTED = range(5)


@dataclass(slots=True)
class SeqEvent:
    """``first_token`` (1 token), ``progress`` (2, 4, 8, ... tokens) or ``finished``.

    ``ttft_s`` and ``total_s`` (only on ``finished``) are measured from when the sequence
    first started running; ``queue_s`` is its wait inside the instance before that.
    """

    kind: str
    seq_id: str
    time: float
    output_tokens_so_far: int
    ttft_s: float | None = None
    total_s: float | None = None
    queue_s: float | None = None
    preempted: int = 0

    @property
    def output_tokens(self) -> int:
        return self.output_tokens_so_far


@dataclass(frozen=True, slots=True)
class SeqTimes:
    """Where one finished sequence's time went (``SimInstance.attribute``), in seconds.

    ``queue_s``: from ``add`` to its first iteration (front end + waiting queue); ``run_s``:
    from then to its last token, made of ``prefill_s`` (iterations computing its prompt
    chunks, or after a preemption its prompt + generated tokens again), ``decode_s``
    (iterations computing one token of it), ``lost_s`` (iterations of attempts a KV
    preemption threw away) and the rest, iterations it sat out while running (the token
    budget was spent before its turn). ``stall_s`` is the part of ``decode_s`` a co-running
    prefill chunk added: in each decode iteration that carried another sequence's chunk, the
    iteration's time less the same iteration with its decodes alone. ``solo_prefill_s`` and
    ``solo_decode_s`` are the same work on this engine with nothing beside it (its prompt in
    budget-sized chunks from the tokens cached at its first admission, then one-token
    steps; the vLLM step model, also on a llama-server engine). So ``prefill_s -
    solo_prefill_s`` is its prompt sharing steps with others, and ``decode_s - stall_s -
    solo_decode_s`` its decode steps stretched by co-running decodes."""

    seq_id: str
    queue_s: float
    run_s: float
    prefill_s: float
    decode_s: float
    stall_s: float
    lost_s: float
    solo_prefill_s: float
    solo_decode_s: float
    preempted: int


@dataclass(frozen=True, slots=True)
class SimLoad:
    running: int
    waiting: int  # includes requests still in the front end (request overhead)
    kv_blocks_used: int
    kv_blocks_total: int
    preemptions: int  # so far, over the instance's life


class _Seq:
    __slots__ = (
        "arrival",
        "blocks",
        "hashes",
        "held",
        "tok_per_block",
        "cached",
        "computed",
        "eligible",
        "first_sched",
        "first_token",
        "generated",
        "id",
        "order",
        "output",
        "preempted",
        "priority",
        "prompt",
        "state",
        "times",
    )

    def __init__(self, seq_id, prompt, output, priority, arrival, order, cached, eligible):
        self.id = seq_id
        self.prompt = prompt
        self.output = output
        self.priority = priority
        self.arrival = arrival
        self.order = order
        self.cached = cached
        self.computed = 0
        self.generated = 0
        self.blocks = 0
        self.state = _PENDING
        self.eligible = eligible
        self.first_sched: float | None = None
        self.first_token: float | None = None
        self.preempted = 0
        self.hashes: tuple[bytes, ...] = ()  # chained prefix-block hashes (prefix caching), or none
        self.tok_per_block = 0.0  # the trace's tokens per hashed block
        self.held = False  # whether it holds references to its blocks in the prefix cache
        # attribution only (``SimInstance.attribute``): [prefill s, decode s, of which
        # stalled by co-running prefill s, lost to preemption s, prompt tokens skipped at
        # first admission]
        self.times: list[float] | None = None


class _Plan:
    """``K`` iterations starting at ``t0``; ``m`` of them committed so far.

    ``ends`` holds Python floats (each iteration's end: a list, or a long decode run's
    ``array('d')``), so a wake reads and bisects it without numpy scalars; a run's ``c0`` /
    ``g0`` / ``out`` are lists for the few sequences most engines run (``_PY_EVENTS_MAX``)
    and arrays above."""

    __slots__ = (
        "K",
        "c0",
        "dec_only",
        "ends",
        "ev_ptr",
        "evs",
        "last",
        "wake",
        "g0",
        "m",
        "ns",
        "out",
        "run",
        "seqs",
        "t0",
    )

    def __init__(self, seqs, ns, K, t0, ends, run, c0=None, g0=None, out=None):
        self.seqs = seqs
        self.ns = ns
        self.K = K
        self.t0 = t0
        self.ends = ends
        self.m = 0
        self.run = run  # True: every sequence decodes one token per iteration
        # runs only: per sequence, tokens computed and generated at t0, and output limits
        self.c0, self.g0, self.out = c0, g0, out
        # runs: (iteration, sequence index, token count) of every first-token/progress
        # event, in iteration order; ev_ptr: the first not yet emitted
        self.evs: list[tuple[int, int, int]] = []
        self.ev_ptr = 0
        self.wake = -1  # the iteration whose end next_event_time last gave (-1: none)
        self.last = t0  # the end of the last committed iteration (t0: none yet)
        # attribution only: seconds the iteration would take with its decodes alone (None:
        # no decode beside a prefill chunk in it, or attribution off)
        self.dec_only: float | None = None


# One ``OperatorModel`` per (GPU profile, model profile, tensor parallelism), shared by every
# engine built from the same three: it is a pure function of them whose per-step-size caches
# (``_per_tok``, ``_head``) then fill once per fleet, not once per engine. Why: at 1,024
# instances each engine saw its own few prefill sizes, and pricing a step size afresh (its
# GEMM rooflines) was most of a general iteration's cost. Same floats: each cache entry is
# the same computation on the same inputs, whichever engine asks first.
_OPERATOR_MODELS: dict[tuple, OperatorModel] = {}


def _operator_model(gpu: GPUProfile, model: ModelProfile, tensor_parallel: int
                    ) -> OperatorModel:
    try:
        key = (gpu, model, tensor_parallel)
        ops = _OPERATOR_MODELS.get(key)
    except TypeError:  # a profile with an unhashable field: not shared
        return OperatorModel(gpu, model, tensor_parallel)
    if ops is None:
        ops = _OPERATOR_MODELS[key] = OperatorModel(gpu, model, tensor_parallel)
    return ops


# A pure-decode iteration of ``S`` sequences reading ``kv`` KV tokens in all takes
# ``ops.step_parts(S, S, S, kv)``: a function of (operator model, S, kv) alone. A decode run
# of ``K`` iterations reads ``kv0, kv0 + S, kv0 + 2S, ...``, so its durations are a strided
# slice of one table per (operator model, S), filled once per fleet and grown as longer
# contexts appear, instead of a dozen array operations over ``K`` new elements per plan.
# Same floats: each entry is ``step_parts``'s element-wise arithmetic (+, *, /, max) on the
# same integer operand, which gives the same double whatever array it sits in.
# A table covers every kv below its top, S times the entries one run reads, so a batch size
# gets one only once ``_DECODE_TABLE_AFTER`` runs of it asked: at 500 queries on 1,024
# instances 1-4 sequences are ~99% of runs and a 9-16 sequence table (tens of thousands of
# entries, ~0.8 ms) would serve a handful; at 5,000 queries 5-16 sequences are a third of
# them. ``_DECODE_TABLE_MAX_S = 0`` turns the tables off (the tests compare).
_DECODE_TABLE_MAX_S = 16
_DECODE_TABLE_AFTER = 16  # runs of one batch size computed directly before its table is made
_DECODE_TABLE_MAX_KV = 1 << 19  # entries per table (4 MiB); longer runs are computed directly

# ``_build_plan``'s short way for a plan that is a decode run of everything running with
# nothing to admit (most plans of a large fleet); False: always the general loop (the tests
# compare the two event by event).
_DECODE_FAST = True

# ``SimInstance.step_until``'s short way for a wake inside a decode run (False: always
# through ``_advance``; the same events, the tests compare).
_WAKE_FAST = True

# ``_build_plan``'s one-pass decode run (``SimInstance._one_pass_run``): the short way above
# as one pass over up to ``_ONE_PASS_MAX`` running sequences, their counts kept as lists and
# the run's events listed in plain Python (``_run_events_py``) up to that size, where the
# short way made numpy arrays above ``_PY_EVENTS_MAX``. False: the short way as before (the
# tests compare event by event).
_RUN_ONE_PASS = True
_ONE_PASS_MAX = 16

# ``_build_plan``'s general loop in one pass where nothing needs preempting
# (``SimInstance._schedule_without_preemption``: every plan that admits a request or runs a
# prompt chunk, unless the KV cache is short). False: always the general loop (the tests
# compare event by event).
_NO_PREEMPT_ONE_PASS = True

# ``SimInstance._decode_ends``: a decode run's ends summed from the table's slice in Python
# (False: through numpy's multiply and cumsum; the same floats, the tests compare).
_PY_DECODE_ENDS = True
_PY_ENDS_MAX = 64  # up to this many iterations summed in Python, a buffer above


class _DecodeTables:
    """One operator model's decode-run durations by batch size (``tabs``: S -> seconds by
    KV tokens read), and how many runs of each size asked before it had one."""

    __slots__ = ("asked", "tabs")

    def __init__(self) -> None:
        self.tabs: dict[int, np.ndarray] = {}
        self.asked: dict[int, int] = {}

    def __deepcopy__(self, memo: dict) -> _DecodeTables:
        """Shared, not copied: a forked simulation (``Simulation.fork``, the alpha tuner's
        forecasts) copies its engines' operator model, whose values the tables are a pure
        function of, so the fork reads and grows the same tables (entries are only added,
        never changed) instead of copying megabytes per fork."""
        return self


_DECODE_TABLES: weakref.WeakKeyDictionary[OperatorModel, _DecodeTables] = \
    weakref.WeakKeyDictionary()


def _decode_tables(ops: OperatorModel) -> _DecodeTables:
    """The decode-run tables of ``ops``, shared by the engines built on it."""
    tables = _DECODE_TABLES.get(ops)
    if tables is None:
        tables = _DECODE_TABLES[ops] = _DecodeTables()
    return tables


def _decode_table(ops: OperatorModel, tables: _DecodeTables, S: int, stop: int
                  ) -> np.ndarray | None:
    """``ops.step_parts(S, S, S, kv)`` for every ``kv < stop`` (at least), kept in
    ``tables`` (``_decode_tables(ops)``); None: compute it directly (too long a run, or a
    batch size not yet asked for often enough to be worth a table)."""
    if stop > _DECODE_TABLE_MAX_KV:
        return None
    tab = tables.tabs.get(S)
    if tab is None:
        asked = tables.asked[S] = tables.asked.get(S, 0) + 1
        if asked <= _DECODE_TABLE_AFTER:
            return None
        n = 0
    else:
        n = len(tab)
        if stop <= n:
            return tab
    # grow geometrically: a table is extended a few times per fleet
    size = min(max(stop, 2 * n, 4096), _DECODE_TABLE_MAX_KV)
    part = np.asarray(ops.step_parts(S, S, S, np.arange(n, size, dtype=np.int64)),
                      dtype=np.float64)
    tab = part if tab is None else np.concatenate((tab, part))
    tables.tabs[S] = tab
    return tab


class SimInstance:
    """One model instance (``tensor_parallel`` GPUs of one kind) with continuous batching.

    ``use_calibration``: when ``gpu`` is the stock profile of ``hardware.GPUS`` and
    ``hardware.CALIBRATIONS`` has constants for this GPU and model, they are applied.
    ``step_overhead_s`` / ``request_overhead_s`` override the profile's values;
    ``num_gpu_blocks`` overrides the computed KV capacity (like vLLM's
    ``num_gpu_blocks_override``); ``max_num_batched_tokens=None`` is vLLM's default for the
    GPU.
    """

    # Slots, not a dict: a wake reads a dozen of an engine's attributes, and across 1,024
    # engines they are mostly cold in cache (the same engine calls cost ~2x inside a run
    # what they cost replayed alone); slots keep them in the object itself and read
    # through the type. Same values, same results.
    __slots__ = (
        "_buf",
        "gpu",
        "model",
        "stall_observer",
        "_free",
        "_n_waiting",
        "_now",
        "_order",
        "_pc_lru",
        "_pc_ref",
        "_pending",
        "_plan",
        "_running",
        "_seqs",
        "_t_bound",
        "_tables",
        "_waiting",
        "attribute",
        "attributed",
        "block_size",
        "busy_s",
        "chunked_prefill",
        "gpu_memory_utilization",
        "jump_ahead",
        "kv_blocks_total",
        "llama_slots",
        "max_num_batched_tokens",
        "max_num_seqs",
        "n_ubatch",
        "name",
        "ops",
        "plans",
        "preemptions",
        "prefix_hit_tokens",
        "prefix_lookup_tokens",
        "prompt_breaks",
        "request_overhead_s",
        "slowdown",
        "steps",
        "tokens_computed",
        "tp",
    )

    def __init__(self, gpu: GPUProfile, model: ModelProfile, tensor_parallel: int = 1, *,
                 max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                 block_size: int = 16, gpu_memory_utilization: float = 0.9,
                 chunked_prefill: bool = True, name: str | None = None,
                 jump_ahead: bool = True, use_calibration: bool = True,
                 step_overhead_s: float | None = None,
                 request_overhead_s: float | None = None,
                 num_gpu_blocks: int | None = None):
        if max_num_batched_tokens is None:
            max_num_batched_tokens = hardware.default_max_num_batched_tokens(gpu)
        if tensor_parallel < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1 \
                or block_size < 1 or not 0 < gpu_memory_utilization <= 1:
            raise ValueError("invalid engine limits")
        if use_calibration and hardware.GPUS.get(gpu.name) == gpu:
            gpu = hardware.calibrated(gpu, model)
        if step_overhead_s is not None:
            gpu = replace(gpu, step_overhead_s=step_overhead_s)
        if request_overhead_s is not None:
            gpu = replace(gpu, request_overhead_s=request_overhead_s)
        self.gpu, self.model, self.tp = gpu, model, tensor_parallel
        self.name = name or f"{gpu.name}/{model.name}"
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.block_size = block_size
        self.gpu_memory_utilization = gpu_memory_utilization
        self.chunked_prefill = chunked_prefill
        self.jump_ahead = jump_ahead
        self.request_overhead_s = gpu.request_overhead_s
        # Token counts before a prompt's end at which a prefill chunk must stop, so the
        # engine can checkpoint there (llama-server on a sliding-window model:
        # agentflow.llm.llamacpp_server.prompt_breaks). () for vLLM.
        self.prompt_breaks: tuple[int, ...] = ()
        # llama-server only: its slots and ubatch size; an iteration is then the sum of its
        # ubatches' passes (agentflow.sim.llama_batches). None for vLLM.
        self.llama_slots: SlotTable | None = None
        self.n_ubatch = 512

        self.kv_blocks_total = hardware.kv_cache_blocks(
            gpu, model, tensor_parallel, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
            gpu_memory_utilization=gpu_memory_utilization)
        if num_gpu_blocks is not None:
            self.kv_blocks_total = int(num_gpu_blocks)
        if self.kv_blocks_total < 1:
            raise ValueError(f"{model.name} does not fit on {tensor_parallel} x {gpu.name} "
                             f"({gpu.mem_gb} GiB at utilization {gpu_memory_utilization})")
        self.ops = _operator_model(gpu, model, tensor_parallel)
        self._tables = _decode_tables(self.ops)  # its decode runs' durations (shared)

        self._seqs: dict[str, _Seq] = {}
        self._running: list[_Seq] = []
        self._waiting: list[tuple] = []  # heap of (priority, arrival, order, seq)
        self._pending: list[tuple] = []  # heap of (eligible, order, seq): in the front end
        self._n_waiting = 0
        self._free = self.kv_blocks_total
        self._plan: _Plan | None = None
        self._t_bound = 0.0  # when the engine is next free to start an iteration
        self._now = 0.0
        self._buf: list = []  # (time, order, kind rank, SeqEvent)
        self._order = 0
        self.steps = 0  # iterations simulated
        # seconds spent in iterations (what a real engine's busy time or its server's CPU
        # seconds measure: agentflow bench real_vs_sim's engine-work figure)
        self.busy_s = 0.0
        self.tokens_computed = 0  # prefill + decode tokens over all iterations
        self.plans = 0  # scheduling decisions (a decode run counts once)
        self.preemptions = 0
        # Every iteration takes this many times its roofline time (fault injection: a slow
        # instance — thermal throttling, a noisy neighbour). 1.0 multiplies exactly.
        self.slowdown = 1.0
        # Automatic prefix caching: block hash -> running sequences holding it, and the
        # evictable blocks (held by none) in LRU order, oldest first.
        self._pc_ref: dict[bytes, int] = {}
        self._pc_lru: OrderedDict[bytes, None] = OrderedDict()
        self.prefix_lookup_tokens = 0  # prompt tokens of admissions that looked up the cache
        self.prefix_hit_tokens = 0  # of which served from it
        # Where each finished sequence's time went (``SeqTimes``, appended to ``attributed``)
        # when True: off by default, as it prices a counterfactual step per mixed
        # iteration. Reads only: the same events with it on or off.
        self.attribute = False
        self.attributed: list[SeqTimes] = []
        # With ``attribute`` on, also called for each iteration that carried both decodes and
        # another sequence's prompt chunk: (its start, the decoding ids, [(prompt id, tokens
        # computed)], the seconds its prompt chunks added to each decode) — who stalled whom
        # (``agentflow bench queue_choice --stall-by-risk``). Reads only, like ``attribute``.
        self.stall_observer: Callable[[float, list[str], list[tuple[str, int]], float],
                                      None] | None = None

    # ------------------------------------------------------------------------------ timing
    def _durations(self, T: int, S: int, B: int, dec_kv: np.ndarray) -> np.ndarray:
        """Seconds of consecutive pure-decode iterations (``T = S = B``) whose decode
        attention reads ``dec_kv[j]`` KV tokens."""
        return self.ops.step_parts(T, S, B, dec_kv) * self.slowdown

    def _decode_run(self, S: int, dkv: int, K: int) -> np.ndarray:
        """Seconds of the ``K`` iterations of a decode run of ``S`` sequences whose first
        reads ``dkv`` KV tokens (each next one ``S`` more): ``_durations``'s values, read
        from the shared table where it covers them (a new array: the caller adds to it)."""
        stop = dkv + S * (K - 1) + 1
        if S <= _DECODE_TABLE_MAX_S:
            tab = _decode_table(self.ops, self._tables, S, stop)
            if tab is not None:
                return tab[dkv:stop:S] * self.slowdown
        return self._durations(S, S, S, dkv + S * np.arange(K, dtype=np.int64))

    def _decode_ends(self, S: int, dkv: int, K: int, tb: float) -> list[float] | array:
        """The ends of a decode run's ``K`` iterations from ``tb`` (``_decode_run``'s
        durations summed in order: ``((tb + dt0) + dt1) + ...``), as Python floats: a list
        for a short run, an ``array('d')`` for a long one.

        Why: a plan is built ~1.3 times a call, and a run is planned to its end though an
        arrival usually cuts it (59% of the iterations planned were run in a 500-query
        replay); ``tolist`` made a float object per planned iteration, a long run's
        hundreds of them churned through the allocator. A long run's ends now stay in
        one buffer (``array('d')``: the same doubles, read as floats one at a time, bisected
        and sliced as the list was). A short one where the shared table covers it at normal
        speed is summed from the slice by ``itertools.accumulate``: the same IEEE additions
        in the same order as ``np.cumsum`` (sequential), and ``x * 1.0 == x``, without
        numpy's multiply, element update and cumsum. ``_PY_DECODE_ENDS = False``: the
        list from numpy's path, as before (the tests compare)."""
        tab = None
        if S <= _DECODE_TABLE_MAX_S:  # as ``_decode_run`` (one table request per run)
            stop = dkv + S * (K - 1) + 1
            tab = _decode_table(self.ops, self._tables, S, stop)
        if tab is None:
            dt = self._durations(S, S, S, dkv + S * np.arange(K, dtype=np.int64))
        elif _PY_DECODE_ENDS and K <= _PY_ENDS_MAX and self.slowdown == 1.0:
            dts = tab[dkv:stop:S].tolist()
            dts[0] = dts[0] + tb
            return list(accumulate(dts))
        else:
            dt = tab[dkv:stop:S] * self.slowdown
        dt[0] += tb
        ends = np.cumsum(dt)  # sequential: ((tb + dt0) + dt1) + ...
        return array("d", ends.tobytes()) if _PY_DECODE_ENDS else ends.tolist()

    def _duration(self, T: int, S: int, B: int, dec_kv: int, pf_tokens: int = 0,
                  pf_pairs: int = 0, pf_kv: int = 0) -> float:
        """One iteration, with the same float operations in the same order as
        ``_durations`` (so one-at-a-time and vectorised runs give bit-identical times)."""
        return float(self.ops.step_parts(T, S, B, dec_kv, pf_tokens, pf_pairs, pf_kv)
                     * self.slowdown)

    def _iteration(self, sched: list, nl: list[int], T: int, S: int, B: int, dec_kv: int,
                   pf_tokens: int, pf_pairs: int, pf_kv: int) -> float:
        """One iteration of ``sched`` computing ``nl`` tokens each (the sums of
        ``step_sums``): a vLLM step, or llama-server's ubatch passes."""
        if self.llama_slots is None:
            return self._duration(T, S, B, dec_kv, pf_tokens, pf_pairs, pf_kv)
        return self._llama_iteration(sched, nl)

    def _llama_iteration(self, sched: list, nl: list[int]) -> float:
        """One llama-server iteration of ``sched`` computing ``nl`` tokens each."""
        slots = self.llama_slots
        assert slots is not None
        pieces = [Piece(slots.slot_of[s.id], n, s.computed, s.generated > 0
                        and s.computed + 1 == s.prompt + s.generated,
                        s.computed + n == s.prompt + s.generated)
                  for s, n in zip(sched, nl)]
        return float(iteration_seconds(self.ops, pieces, self.n_ubatch) * self.slowdown)

    def _llama_decode_run(self, sched: list, j: np.ndarray) -> np.ndarray:
        """Iterations ``j`` of a llama-server decode run (same sums as ``_llama_iteration``)."""
        slots = self.llama_slots
        assert slots is not None
        return decode_run_seconds(self.ops, [slots.slot_of[s.id] for s in sched],
                                  [s.computed + 1 for s in sched], j) * self.slowdown

    def step_time(self, ns, contexts) -> float:
        """Seconds of one iteration in which sequence i computes ``ns[i]`` tokens on top of
        ``contexts[i]`` cached ones."""
        sh = StepShape.of(ns, contexts)
        return self._duration(sh.tokens, sh.seqs, sh.decode_seqs, sh.decode_kv,
                              sh.prefill_tokens, sh.prefill_pairs, sh.prefill_kv)

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        """One decode iteration of ``batch`` sequences that each hold ``context_tokens``."""
        return self.step_time([1] * batch, [context_tokens] * batch)

    # --------------------------------------------------------------------------------- API
    def add(self, seq_id: str, prompt_tokens: int, output_tokens: int, priority: int,
            now: float, cached_tokens: int = 0, prefix_hashes: tuple[bytes, ...] = (),
            tokens_per_block: float = 0.0) -> None:
        """Admit a request at ``now``; it generates exactly ``output_tokens`` (at least 1).

        ``prefix_hashes``: its prompt's chained block hashes, for automatic prefix caching
        (then ``cached_tokens`` is ignored: hits are found at admission); a hit of ``h``
        blocks skips ``h * tokens_per_block`` prompt tokens (whole engine blocks).
        Raises ValueError if it can never fit in the KV cache on its own."""
        if seq_id in self._seqs:
            raise ValueError(f"{self.name}: duplicate sequence id {seq_id!r}")
        prompt_tokens = max(1, int(prompt_tokens))
        output_tokens = max(1, int(output_tokens))
        need = -(-(prompt_tokens + output_tokens) // self.block_size)
        if need > self.kv_blocks_total:
            raise ValueError(f"{self.name}: {prompt_tokens}+{output_tokens} tokens exceed the "
                             f"KV cache ({self.kv_blocks_total * self.block_size} tokens)")
        self._advance(now, self._buf)
        self._now = max(self._now, now)
        cached = min(max(0, int(cached_tokens)), prompt_tokens - 1)
        cached -= cached % self.block_size
        s = _Seq(seq_id, prompt_tokens, output_tokens, priority, now, self._order, cached,
                 now + self.request_overhead_s)
        if prefix_hashes:
            s.cached = 0
            s.hashes = tuple(prefix_hashes)
            s.tok_per_block = float(tokens_per_block)
        self._order += 1
        self._seqs[seq_id] = s
        self._n_waiting += 1
        if self._plan is None:
            self._t_bound = max(self._t_bound, now)
        if self.request_overhead_s > 0:
            heapq.heappush(self._pending, (s.eligible, s.order, s))
            self._cut_plan(s.eligible)
        else:
            self._push_waiting(s)
            self._cut_plan(now)

    def abort(self, seq_id: str, now: float | None = None) -> bool:
        """Cancel a sequence; its KV blocks are freed at once. False if unknown/finished."""
        if now is not None:
            self._advance(now, self._buf)
            self._now = max(self._now, now)
        s = self._seqs.pop(seq_id, None)
        if s is None:
            return False
        if s.state in (_WAITING, _PENDING):
            self._n_waiting -= 1
            if s.state == _WAITING:  # it may have been blocking the head of the queue
                self._cut_plan(self._now)
        elif s.state == _RUNNING:
            self._free += s.blocks
            s.blocks = 0
            self._running.remove(s)
            self._prefix_release(s)
            if self.llama_slots is not None:
                self.llama_slots.release(s.id, self._now)
            self._cut_plan(self._now)
        s.state = _ABORTED
        return True

    def set_slowdown(self, factor: float, now: float) -> None:
        """From the iteration after the one in flight at ``now``, iterations take ``factor``
        times as long (1.0: normal speed again)."""
        if not factor > 0:
            raise ValueError("slowdown factor must be positive")
        self._advance(now, self._buf)
        self._now = max(self._now, now)
        self._cut_plan(self._now)
        self.slowdown = float(factor)

    @property
    def sequences(self) -> list[str]:
        """Ids of the sequences the engine holds (queued, in the front end or running)."""
        return list(self._seqs)

    def next_event_time(self) -> float | None:
        """When ``step_until`` next has something to do, or None when idle."""
        if self._buf:
            return min(e[0] for e in self._buf)
        p = self._plan
        if p is None:
            if not self._running and self._n_waiting == 0:
                return None
            t0 = max(self._t_bound, self._now)
            if not self._running and not self._has_waiting():  # only front-end requests
                te = max(self._t_bound, self._pending[0][0])
                if te > self._now:
                    return te
                t0 = te
            self._build_plan(t0)
            p = self._plan
            if p is None:  # nothing schedulable until a pending request becomes eligible
                return self._pending[0][0] if self._pending else None
        if not p.run:
            return p.ends[0]
        k = p.evs[p.ev_ptr][0] if p.ev_ptr < len(p.evs) else p.K - 1
        if k >= p.K:
            k = p.K - 1
        p.wake = k
        return p.ends[k]

    def step_until(self, t: float) -> list[SeqEvent]:
        """Run every iteration that ends at or before ``t``; the events, in time order (ties:
        admission order, then first_token < progress < finished)."""
        p = self._plan
        if _WAKE_FAST and p is not None and p.run and not self._buf:
            # Woken at the end ``next_event_time`` gave, inside a decode run and before its
            # last iteration: what ``_advance`` does then (commit through that iteration,
            # nothing finishes, no new plan), without its loop. Most wakes of a fleet.
            k = p.wake
            if p.m <= k and k + 1 < p.K:
                ends = p.ends
                if ends[k] == t and ends[k + 1] > t:
                    events: list = []
                    self._commit(p, k + 1, events)
                    if t > self._now:
                        self._now = t
                    if len(events) < 2:
                        return [events[0][3]] if events else []
                    events.sort(key=_event_key)
                    return [e[3] for e in events]
        events, self._buf = self._buf, []
        self._advance(t, events)
        if t > self._now:
            self._now = t
        if len(events) < 2:  # most wakes: one event (no comprehension frame for it)
            return [events[0][3]] if events else []
        events.sort(key=_event_key)
        return [e[3] for e in events]

    def load(self) -> SimLoad:
        used = self.kv_blocks_total - self._free
        p = self._plan
        if p is not None and p.run and p.m > 0:  # blocks taken lazily inside a decode run
            alive = np.array([s.state == _RUNNING for s in p.seqs])
            c0 = np.asarray(p.c0, dtype=np.int64)
            need = -(-(c0 + p.m + 1) // self.block_size)
            had = -(-(c0 + 1) // self.block_size)
            used += int(np.maximum(need - had, 0)[alive].sum())
        return SimLoad(running=len(self._running), waiting=self._n_waiting,
                       kv_blocks_used=used, kv_blocks_total=self.kv_blocks_total,
                       preemptions=self.preemptions)

    def tokens_written(self, t: float) -> dict[str, int]:
        """Output tokens each running sequence has written by ``t``, as a streaming client
        would count them. Events report only 1, 2, 4, 8... (a driver is not woken for
        silent decode steps); whoever must see the count between them (preemption prices
        a call's remainder and redo from it) reads it here. Reads, never advances: the
        plan in flight is counted up to ``t`` and nothing is committed, so asking changes
        no result."""
        out = {s.id: s.generated for s in self._running}
        p = self._plan
        if p is None:
            return out
        if p.run:  # iteration j writes token g0 + j + 1 of every sequence
            done = min(p.K, bisect_right(p.ends, t))
            for i, s in enumerate(p.seqs):
                if s.state == _RUNNING:
                    out[s.id] = int(p.g0[i]) + done
        elif p.m == 0 and p.ends[0] <= t:  # one iteration, ended but not yet committed
            for s, n in zip(p.seqs, p.ns):
                if s.state == _RUNNING and s.computed + n == s.prompt + s.generated:
                    out[s.id] = s.generated + 1
        return out

    @property
    def idle(self) -> bool:
        return self._plan is None and not self._running and self._n_waiting == 0

    # ---------------------------------------------------------------------------- internals
    def _push_waiting(self, s: _Seq) -> None:
        s.state = _WAITING
        heapq.heappush(self._waiting, (s.priority, s.arrival, s.order, s))

    def _has_waiting(self) -> bool:
        w = self._waiting
        while w and w[0][3].state != _WAITING:
            heapq.heappop(w)
        return bool(w)

    def _cut_plan(self, t: float) -> None:
        """Inputs change at ``t``: a decode run ends with the iteration in flight at ``t``, or
        at ``t`` itself when an iteration ends exactly then (as if planned one at a time)."""
        p = self._plan
        if p is None or not p.run:
            return
        k = max(p.m, bisect_left(p.ends, t) + 1)
        if k < p.K:
            p.K = k
            p.ends = p.ends[:k]
        if p.m == p.K:
            self._finish_plan(p, self._buf)

    def _advance(self, t: float, events: list) -> None:
        while True:
            p = self._plan
            if p is None:
                if not self._running and self._n_waiting == 0:
                    return
                tb = self._t_bound
                if not self._running and not self._has_waiting():
                    tb = max(tb, self._pending[0][0])
                if tb >= t:  # a plan starting at t is built later, once inputs at t are in
                    return
                self._build_plan(tb)
                p = self._plan
                if p is None:
                    if self._pending and self._pending[0][0] < t:
                        self._t_bound = max(tb, self._pending[0][0])
                        continue
                    return
            if p.run:
                ends, k = p.ends, p.wake
                if p.m <= k < p.K and ends[k] == t and (k + 1 == p.K or ends[k + 1] > t):
                    m = k + 1  # woken at the end it asked for: what bisecting would find
                else:  # iterations before p.m ended by an earlier t: bisect above them
                    m = bisect_right(ends, t, p.m)
                    if m > p.K:
                        m = p.K
            else:
                m = 1 if p.ends[0] <= t else 0
            if m > p.m:
                self._commit(p, m, events)
            if p.m < p.K:
                return
            self._finish_plan(p, events)

    def _launch_into_slots(self) -> None:
        """Every waiting request takes a free llama-server slot (no tokens yet): the server
        launches a task into a slot between iterations whether or not this batch has room
        for its prompt, and then fills the batch in slot order (``fill_key``)."""
        w = self._waiting
        assert self.llama_slots is not None
        while w and len(self._running) < self.max_num_seqs:
            s = heapq.heappop(w)[3]
            if s.state != _WAITING:
                continue
            self._n_waiting -= 1
            s.state = _RUNNING
            s.computed = s.cached if s.first_sched is None else 0
            s.blocks = 0
            self._running.append(s)
            self.llama_slots.take(s.id)

    def _cut_at_breaks(self, s: _Seq, computed: int, n: int) -> int:
        """``n`` prompt tokens from ``computed`` on, stopped at the first break passed."""
        for back in self.prompt_breaks:
            stop = s.prompt - back
            if computed < stop < computed + n:
                n = stop - computed
        return n

    def _build_plan(self, tb: float) -> None:
        self._t_bound = tb
        pend = self._pending
        while pend and pend[0][0] <= tb:
            s = heapq.heappop(pend)[2]
            if s.state == _PENDING:
                self._push_waiting(s)
        B = self.block_size
        budget = self.max_num_batched_tokens
        if self.llama_slots is not None:  # llama-server's slots: agentflow.llm.llama_batches
            self._launch_into_slots()
            self._running.sort(key=fill_key(self.llama_slots))
        running = self._running
        breaks = self.prompt_breaks  # () on vLLM: no call per sequence to cut at none
        sched: list[_Seq]
        if (_RUN_ONE_PASS and _DECODE_FAST and self.jump_ahead and running
                and self.llama_slots is None and not breaks
                and len(running) <= _ONE_PASS_MAX and len(running) <= budget
                and not self._has_waiting() and self._one_pass_run(tb, running)):
            return
        if (_DECODE_FAST and self.jump_ahead and running and self.llama_slots is None
                and not breaks
                and len(running) <= budget and not self._has_waiting()
                and self._all_decode(running)):
            # The most common plan: every running sequence decodes one token and nothing
            # waits to be admitted. What the general loop below gives then (each asks for
            # 1 token within the budget, takes its next block from the free pool, nothing
            # is preempted or admitted), without its per-sequence bookkeeping: the same
            # schedule, counts and ``step_sums`` (every piece 1 token).
            for s in running:
                need = -(-(s.computed + 1) // B) - s.blocks
                s.blocks += need
                self._free -= need
                if s.first_sched is None:
                    s.first_sched = tb
            sched = list(running)
            n_run = len(sched)
            nl = [1] * n_run
            computed = [s.computed for s in sched]
            self.plans += 1
            T = S = nd = n_run
            dkv, pt, pp, pkv = sum(computed) + n_run, 0, 0, 0
            run = True
        else:
            got = None
            if _NO_PREEMPT_ONE_PASS and self.llama_slots is None and not breaks:
                got = self._schedule_without_preemption(tb, running)
            if got is not None:
                sched, nl = got
                preempted = False
                if not sched:
                    self._plan = None
                    return
            else:
                sched = []
                ns: dict[_Seq, int] = {}
                preempted = False
                i = 0
                while i < len(running) and budget > 0:
                    s = running[i]
                    n = s.prompt + s.generated - s.computed
                    if n > budget:
                        n = budget
                    if breaks:
                        n = self._cut_at_breaks(s, s.computed, n)
                    need = -(-(s.computed + n) // B) - s.blocks
                    if need > self._free:
                        while need > self._free:
                            victim = max(running, key=lambda r: (r.priority, r.arrival, r.order))
                            vi = running.index(victim)
                            self._preempt(victim)
                            preempted = True
                            if victim is s:
                                break
                            if victim in ns:
                                budget += ns.pop(victim)
                                sched.remove(victim)
                            if vi < i:
                                i -= 1
                        if s.state != _RUNNING:
                            continue
                    s.blocks += need
                    self._free -= need
                    if s.first_sched is None:  # launched into a llama-server slot before any token
                        s.first_sched = tb
                    sched.append(s)
                    ns[s] = n
                    budget -= n
                    i += 1
                if not preempted:
                    first = len(sched)
                    admitted: list[int] = []
                    self._admit_waiting(tb, running, sched, admitted, budget, breaks)
                    for s, n in zip(sched[first:], admitted):
                        ns[s] = n
                if not sched:
                    self._plan = None
                    if preempted:  # everything running was preempted: admit from the queue now
                        self._build_plan(tb)
                    return
                nl = [ns[s] for s in sched]
            self.plans += 1
            computed = [s.computed for s in sched]
            T, S, nd, dkv, pt, pp, pkv = step_sums(nl, computed)
            run = (self.jump_ahead and not preempted and T == len(sched) == len(running)
                   and all(s.prompt + s.generated - s.computed == 1 for s in sched))
        if not run:
            self._plan = _Plan(sched, nl, 1, tb,
                               [tb + self._iteration(sched, nl, T, S, nd, dkv, pt, pp, pkv)],
                               False)
            if self.attribute and 0 < nd < S:
                self._plan.dec_only = self._decodes_alone(sched, nl, nd, dkv)
            return
        c0: list[int] | np.ndarray  # tokens computed, generated and to generate, at tb
        g0: list[int] | np.ndarray
        out: list[int] | np.ndarray
        if S <= _PY_EVENTS_MAX:  # the few sequences of most engines: plain Python
            c0 = computed
            g0 = [s.generated for s in sched]
            out = [s.output for s in sched]
            K = min(map(operator.sub, out, g0))
            if K > 1:  # blocks for iterations 1..K-1 must come from the free pool
                blocks = 0
                for c in c0:
                    first = B - c % B  # iteration at which it next needs a block
                    if first <= K - 1:
                        blocks += (K - 1 - first) // B + 1
                if blocks > self._free:
                    K = self._blocks_run_out(np.array(c0, dtype=np.int64), K)
        else:
            c0 = np.fromiter((s.computed for s in sched), dtype=np.int64, count=S)
            g0 = np.fromiter((s.generated for s in sched), dtype=np.int64, count=S)
            out = np.fromiter((s.output for s in sched), dtype=np.int64, count=S)
            K = int((out - g0).min())
            if K > 1:
                firsts = B - (c0 % B)
                cnt = np.where(firsts <= K - 1, (K - 1 - firsts) // B + 1, 0)
                if int(cnt.sum()) > self._free:
                    K = self._blocks_run_out(c0, K)
        ends: list[float] | array
        if K == 1:
            ends = [tb + self._iteration(sched, nl, T, S, nd, dkv, pt, pp, pkv)]
        elif self.llama_slots is None:
            ends = self._decode_ends(S, dkv, K, tb)
        else:
            dt = self._llama_decode_run(sched, np.arange(K, dtype=np.int64))
            dt[0] += tb
            ends = np.cumsum(dt).tolist()  # sequential: ((tb + dt0) + dt1) + ...
        if self._pending:  # cut after the iteration in flight when a request turns eligible
            te = self._pending[0][0]
            k = bisect_left(ends, te) + 1
            if k < K:
                K = k
                ends = ends[:K]
        p = _Plan(sched, nl, K, tb, ends, True, c0, g0, out)
        p.evs = _run_events(g0, out, K)
        self._plan = p

    def _one_pass_run(self, tb: float, running: list[_Seq]) -> bool:
        """The decode-run short way of ``_build_plan`` in one pass over ``running``: False,
        with nothing changed, where it does not apply (a sequence not decoding one token, or
        its next KV block not free, in order: ``_all_decode``'s test); else the plan is made.

        The same plan as the short way: each sequence takes its next block from the free
        pool in order, the run's length and its block count are the same integer sums
        (lists here; numpy's ``%``, ``//``, ``where`` and ``sum`` on int64 above
        ``_PY_EVENTS_MAX`` give the same integers), the same durations (``_decode_ends``,
        or ``_duration`` for one iteration, as ``_iteration`` calls it without llama
        slots) and the same event list (``_run_events_py`` equals ``_run_events_numpy``,
        order included). Why: a plan is built ~2.7 times a call and half of them are
        these runs; the short way walked the sequences five times (the test, the blocks,
        three count lists) and then the event list once more, and above 8 sequences its
        numpy calls cost ~180 us a plan against ~30 in Python (replayed engine calls of a
        3,000-query fleet run, where 9-16 sequences were ~2% of the runs)."""
        B = self.block_size
        free = self._free
        c0: list[int] = []
        g0: list[int] = []
        out: list[int] = []
        needs: list[int] = []
        K = -1
        for s in running:
            c = s.computed
            g = s.generated
            if s.prompt + g - c != 1:
                return False
            need = -(-(c + 1) // B) - s.blocks
            if need > free:
                return False
            free -= need
            o = s.output
            if K < 0 or o - g < K:
                K = o - g
            c0.append(c)
            g0.append(g)
            out.append(o)
            needs.append(need)
        for s, need in zip(running, needs):  # each was admitted: its first_sched is set
            s.blocks += need
        self._free = free
        self.plans += 1
        S = len(running)
        dkv = sum(c0) + S
        if K > 1:  # blocks for iterations 1..K-1 must come from the free pool
            blocks = 0
            for c in c0:
                first = B - c % B  # iteration at which it next needs a block
                if first <= K - 1:
                    blocks += (K - 1 - first) // B + 1
            if blocks > free:
                K = self._blocks_run_out(np.array(c0, dtype=np.int64), K)
        ends: list[float] | array
        if K == 1:
            ends = [tb + self._duration(S, S, S, dkv)]
        else:
            ends = self._decode_ends(S, dkv, K, tb)
        if self._pending:  # cut after the iteration in flight when a request turns eligible
            te = self._pending[0][0]
            k = bisect_left(ends, te) + 1
            if k < K:
                K = k
                ends = ends[:K]
        p = _Plan(list(running), [1] * S, K, tb, ends, True, c0, g0, out)
        p.evs = _run_events_py(g0, out, K)
        self._plan = p
        return True

    def _schedule_without_preemption(self, tb: float, running: list[_Seq]
                                     ) -> tuple[list[_Seq], list[int]] | None:
        """The general loop of ``_build_plan`` (vLLM's schedule: running sequences in order
        within the token budget, then admissions from the waiting queue) where no running
        sequence needs a KV block that is not free, so nothing is preempted: None, with
        nothing changed, when one would; else the scheduled sequences and their token
        counts, the engine's state changed as the general loop changes it.

        The same schedule: a first pass gives each running sequence the tokens the general
        loop would (its uncomputed ones cut to the budget left, until the budget is spent)
        and checks its blocks against the free pool in order, the only place the loop
        preempts; then the blocks are taken and the admissions run as in the loop (vLLM
        with no prompt breaks and no llama-server slots). Why: half of the plans a call
        costs are these (a prompt chunk beside the decodes), and the loop's dictionary of
        counts, preemption tests and per-sequence branches cost more than the schedule."""
        B = self.block_size
        budget = self.max_num_batched_tokens
        free = self._free
        nl: list[int] = []
        needs: list[int] = []
        for s in running:
            if budget <= 0:
                break
            c = s.computed
            n = s.prompt + s.generated - c
            if n > budget:
                n = budget
            need = -(-(c + n) // B) - s.blocks
            if need > free:
                return None
            free -= need
            nl.append(n)
            needs.append(need)
            budget -= n
        sched = running[:len(nl)]
        for s, need in zip(sched, needs):  # each was admitted: its first_sched is set
            s.blocks += need
        self._free = free
        self._admit_waiting(tb, running, sched, nl, budget, ())
        return sched, nl

    def _admit_waiting(self, tb: float, running: list[_Seq], sched: list[_Seq],
                       counts: list[int], budget: int, breaks: tuple[int, ...]) -> None:
        """Admissions from the waiting queue, in its order, within the ``budget`` tokens
        the running sequences left (vLLM's schedule after the running ones; one loop for
        the general schedule and the no-preemption pass): each admitted sequence is
        appended to ``running`` and ``sched``, its token count to ``counts``."""
        B = self.block_size
        w = self._waiting
        M = self.max_num_batched_tokens
        while w and budget > 0 and len(running) < self.max_num_seqs:
            s = w[0][3]
            if s.state != _WAITING:
                heapq.heappop(w)
                continue
            if s.hashes:
                comp = self._prefix_hit(s)
            else:
                comp = s.cached if s.first_sched is None else 0
            unc = s.prompt + s.generated - comp
            if unc > budget:
                if self.chunked_prefill:
                    n = budget
                elif budget == M:  # longer than the budget: runs alone, whole
                    n = unc
                else:
                    break
            else:
                n = unc
            if breaks:
                n = self._cut_at_breaks(s, comp, n)
            need = -(-(comp + n) // B)
            if need > self._free:
                break
            heapq.heappop(w)
            self._n_waiting -= 1
            s.state = _RUNNING
            s.computed = comp
            if s.hashes:
                self._prefix_hold(s, comp)
            s.blocks = need
            self._free -= need
            if s.first_sched is None:
                s.first_sched = tb
            running.append(s)
            if self.llama_slots is not None:
                self.llama_slots.take(s.id)
            sched.append(s)
            counts.append(n)
            budget -= n

    def _all_decode(self, running: list[_Seq]) -> bool:
        """Whether every running sequence would decode one token now and find its next KV
        block free, in order (the general loop's test, so no preemption can follow)."""
        B, free = self.block_size, self._free
        for s in running:
            if s.prompt + s.generated - s.computed != 1:
                return False
            need = -(-(s.computed + 1) // B) - s.blocks
            if need > free:
                return False
            free -= need
        return True

    def _blocks_run_out(self, c0: np.ndarray, K: int) -> int:
        """The iterations a decode run of ``K`` can make before its sequences (``c0`` tokens
        computed each) need more new KV blocks than are free."""
        B = self.block_size
        first = B - (c0 % B)
        cnt = np.where(first <= K - 1, (K - 1 - first) // B + 1, 0)
        steps = np.sort(np.concatenate([np.arange(f, K, B) for f in first[cnt > 0].tolist()]))
        return int(steps[self._free])

    # --------------------------------------------------------------------- attribution
    def _decodes_alone(self, sched: list, nl: list[int], nd: int, dkv: int) -> float:
        """Seconds of the iteration ``sched`` / ``nl`` with only its one-token pieces."""
        if self.llama_slots is None:
            return self._duration(nd, nd, nd, dkv)
        pairs = [(s, n) for s, n in zip(sched, nl) if n == 1]
        return self._llama_iteration([s for s, _ in pairs], [n for _, n in pairs])

    def _attribute_step(self, p: _Plan, dt: float) -> None:
        """Charge one general iteration of ``dt`` seconds to the sequences it computed."""
        observe = self.stall_observer is not None and p.dec_only is not None
        decoding: list[str] = []
        prompts: list[tuple[str, int]] = []
        for s, n in zip(p.seqs, p.ns):
            if s.state != _RUNNING:
                continue
            tm = s.times
            if tm is None:
                tm = s.times = [0.0, 0.0, 0.0, 0.0, float(s.computed)]
            if n == 1 and s.generated > 0 and s.computed + 1 == s.prompt + s.generated:
                tm[1] += dt
                if p.dec_only is not None:
                    tm[2] += dt - p.dec_only
                if observe:
                    decoding.append(s.id)
            else:
                tm[0] += dt
                if observe:
                    prompts.append((s.id, n))
        if observe and decoding and prompts:
            assert self.stall_observer is not None and p.dec_only is not None
            self.stall_observer(p.t0, decoding, prompts, dt - p.dec_only)

    def _solo_s(self, s: _Seq, cached: int) -> tuple[float, float]:
        """(prefill, decode) seconds of ``s``'s work on this engine with nothing beside it."""
        c, M, pf = cached, self.max_num_batched_tokens, 0.0
        while c < s.prompt:
            n = min(M, s.prompt - c)
            pf += self.step_time([n], [c])
            c += n
        dec = 0.0
        if s.output > 1:
            dec = float(self._durations(1, 1, 1, np.arange(s.prompt + 1, s.prompt + s.output,
                                                              dtype=np.int64)).sum())
        return pf, dec

    def _record_times(self, s: _Seq, t: float) -> None:
        first_sched = s.first_sched
        assert first_sched is not None
        tm = s.times or [0.0, 0.0, 0.0, 0.0, float(s.cached)]
        solo_pf, solo_dec = self._solo_s(s, int(tm[4]))
        self.attributed.append(SeqTimes(
            s.id, first_sched - s.arrival, t - first_sched, tm[0], tm[1], tm[2], tm[3],
            solo_pf, solo_dec, s.preempted))

    # ------------------------------------------------------------------ prefix caching
    def _prefix_hit(self, s: _Seq) -> int:
        """Prompt tokens of ``s`` found in the cache now (whole blocks, < its prompt)."""
        lru = self._pc_lru
        # Evictable blocks live in free memory. Trimming here, lazily, evicts what trimming
        # at every allocation would: releases only append newer entries and nothing is
        # touched between lookups, so the oldest entries now are the ones evicted then.
        while len(lru) > self._free:
            lru.popitem(last=False)
        ref = self._pc_ref
        h = 0
        for x in s.hashes:
            if x not in ref and x not in lru:
                break
            h += 1
        cached = min(int(h * s.tok_per_block), s.prompt - 1)
        return cached - cached % self.block_size

    def _prefix_hold(self, s: _Seq, hit: int) -> None:
        self.prefix_lookup_tokens += s.prompt
        self.prefix_hit_tokens += hit
        ref, lru = self._pc_ref, self._pc_lru
        for x in s.hashes:
            if x in lru:
                del lru[x]
            ref[x] = ref.get(x, 0) + 1
        s.held = True

    def _prefix_release(self, s: _Seq) -> None:
        if not s.held:
            return
        s.held = False
        ref, lru = self._pc_ref, self._pc_lru
        for x in reversed(s.hashes):  # tail blocks are evicted first
            n = ref[x] - 1
            if n:
                ref[x] = n
            else:
                del ref[x]
                lru[x] = None

    def _preempt(self, s: _Seq) -> None:
        self._running.remove(s)
        if self.llama_slots is not None:
            self.llama_slots.release(s.id, self._t_bound)
        self._free += s.blocks
        s.blocks = 0
        self._prefix_release(s)
        s.computed = 0
        s.preempted += 1
        self.preemptions += 1
        tm = s.times
        if tm is not None:  # the attempt's iterations are lost; its redo is counted anew
            tm[3] += tm[0] + tm[1]
            tm[0] = tm[1] = tm[2] = 0.0
        self._n_waiting += 1
        self._push_waiting(s)

    def _commit(self, p: _Plan, m: int, events: list) -> None:
        """Commit iterations p.m .. m-1 of the plan (emit their events)."""
        if not p.run:  # one general iteration
            t = p.ends[0]
            if self.attribute:
                self._attribute_step(p, float(t - p.t0))
            for s, n in zip(p.seqs, p.ns):
                if s.state != _RUNNING:
                    continue
                s.computed += n
                if s.computed == s.prompt + s.generated:
                    s.generated += 1
                    self._token_event(s, s.generated, t, events)
            p.m = 1
            self.steps += 1
            self.busy_s += float(t - p.t0)
            self.tokens_computed += sum(p.ns)
            return
        evs, k, ends = p.evs, p.ev_ptr, p.ends
        n_evs = len(evs)
        while k < n_evs and evs[k][0] < m:
            it, i, pw = evs[k]
            k += 1
            s = p.seqs[i]
            if s.state == _RUNNING:
                t = ends[it]
                if pw == 1:
                    s.first_token = t
                    events.append((t, s.order, 0, SeqEvent("first_token", s.id, t, 1,
                                                            preempted=s.preempted)))
                else:
                    events.append((t, s.order, 1, SeqEvent("progress", s.id, t, pw,
                                                            preempted=s.preempted)))
        p.ev_ptr = k
        if m > p.m:
            end = ends[m - 1]
            dt = end - p.last  # ends[p.m - 1], or t0, without reading the list again
            p.last = end
            self.busy_s += dt
            if self.attribute:
                for s in p.seqs:
                    if s.state == _RUNNING:
                        if s.times is None:
                            s.times = [0.0, 0.0, 0.0, 0.0, float(s.cached)]
                        s.times[1] += dt
        self.steps += m - p.m
        self.tokens_computed += (m - p.m) * len(p.seqs)
        p.m = m

    def _token_event(self, s: _Seq, g: int, t: float, events: list) -> None:
        if g == 1:
            s.first_token = t
            events.append((t, s.order, 0, SeqEvent("first_token", s.id, t, 1,
                                                    preempted=s.preempted)))
        if g == s.output:
            self._finish_seq(s, t, events)
        elif g > 1 and g & (g - 1) == 0:
            events.append((t, s.order, 1, SeqEvent("progress", s.id, t, g,
                                                    preempted=s.preempted)))

    def _finish_seq(self, s: _Seq, t: float, events: list) -> None:
        s.state = _DONE
        if self.llama_slots is not None:
            self.llama_slots.release(s.id, t)
        self._free += s.blocks
        s.blocks = 0
        self._prefix_release(s)
        self._seqs.pop(s.id, None)
        first_sched, first_token = s.first_sched, s.first_token
        assert first_sched is not None and first_token is not None  # it ran to its end
        if self.attribute:
            self._record_times(s, t)
        events.append((t, s.order, 2, SeqEvent(
            "finished", s.id, t, s.generated, ttft_s=first_token - first_sched,
            total_s=t - first_sched, queue_s=first_sched - s.arrival,
            preempted=s.preempted)))

    def _finish_plan(self, p: _Plan, events: list) -> None:
        """All of the plan's iterations are committed: write the run's state back."""
        self._plan = None
        self._t_bound = p.ends[p.K - 1]
        if p.run:
            B = self.block_size
            m = p.m
            t = p.ends[m - 1]
            done = False
            for i, s in enumerate(p.seqs):
                if s.state != _RUNNING:
                    continue
                s.computed = int(p.c0[i]) + m
                s.generated = g = int(p.g0[i]) + m
                nb = -(-s.computed // B)
                if nb > s.blocks:
                    self._free -= nb - s.blocks
                    s.blocks = nb
                if g == s.output:
                    self._finish_seq(s, t, events)
                    done = True
            if done:
                self._running = [s for s in self._running if s.state == _RUNNING]
        else:
            if any(s.state == _DONE for s in p.seqs):
                self._running = [s for s in self._running if s.state == _RUNNING]


def _event_key(e: tuple) -> tuple:
    """Events in time order; ties: admission order, then first_token < progress < finished."""
    return e[:3]


# Up to this many sequences a decode run's events are listed in plain Python: numpy's
# dozen calls cost more than the loop for the few sequences most engines of a large,
# lightly loaded fleet run (same list either way: ``_run_events_numpy``).
_PY_EVENTS_MAX = 8


def _run_events(g0: list[int] | np.ndarray, out: list[int] | np.ndarray, K: int
                ) -> list[tuple[int, int, int]]:
    """(iteration, sequence index, token count) of every first-token/progress event of a
    decode run of ``K`` iterations, in iteration order (ties: smaller count, then sequence
    order): token counts that are powers of two, reached at iteration ``pw - g0 - 1`` (a
    sequence's last token is reported by its finish event instead, unless it is its first)."""
    if len(g0) > _PY_EVENTS_MAX:
        return _run_events_numpy(np.asarray(g0, dtype=np.int64),
                                 np.asarray(out, dtype=np.int64), K)
    return _run_events_py(g0.tolist() if isinstance(g0, np.ndarray) else g0,
                          out.tolist() if isinstance(out, np.ndarray) else out, K)


def _run_events_py(g0: list[int], out: list[int], K: int) -> list[tuple[int, int, int]]:
    """``_run_events`` in plain Python, for lists of any length (the same list as
    ``_run_events_numpy``: both order by iteration, then power of two, then sequence)."""
    found = []
    for i, (g, o) in enumerate(zip(g0, out)):
        b = (g + 1).bit_length() - 1  # the first power of two not yet written: >= g + 1
        pw = 1 << b
        if pw < g + 1:
            pw <<= 1
            b += 1
        while pw - g - 1 < K:
            if pw != o or pw == 1:
                found.append((pw - g - 1, b, i, pw))
            pw <<= 1
            b += 1
    found.sort()
    return [(it, i, pw) for it, _, i, pw in found]


def _run_events_numpy(g0: np.ndarray, out: np.ndarray, K: int) -> list[tuple[int, int, int]]:
    """``_run_events`` over arrays (many sequences)."""
    top = int((g0 + K).max()).bit_length()
    pw = np.left_shift(np.int64(1), np.arange(top, dtype=np.int64))[:, None]
    it = pw - g0[None, :] - 1
    ok = (it >= 0) & (it < K) & ((pw != out[None, :]) | (pw == 1))
    kk, ss = np.nonzero(ok)
    if not len(kk):
        return []
    its = it[kk, ss]
    order = np.argsort(its, kind="stable")
    return list(zip(its[order].tolist(), ss[order].tolist(), pw[kk[order], 0].tolist()))


def engine_for(name: str, cfg, gpu: hardware.GPUProfile | None = None) -> SimInstance:
    """The engine an ``InstanceConfig`` describes: its GPU and model profiles at its weight
    and KV precision, tensor parallelism and vLLM limits (``gpu``: a profile to use in
    place of the named one; a ``llama_server`` instance without one takes this host's
    profile from ``agentflow calibrate`` where one is stored: ``sim.host_profiles``)."""
    model = hardware.model(cfg.model)
    if (cfg.weight_bits, cfg.kv_bits) != (16, 16):
        model = model.quantized(cfg.weight_bits, cfg.kv_bits)
    backend = getattr(cfg, "backend", None) or {}
    if gpu is None and backend.get("type") == "llama_server":
        # a local engine: this host is its hardware, so its host profile if one is stored
        from agentflow.sim.host_profiles import local_profile

        gpu = local_profile(cfg.gpu, cfg.model)
    engine = SimInstance(gpu=gpu or hardware.gpu(cfg.gpu), model=model,
                         tensor_parallel=cfg.tensor_parallel, max_num_seqs=cfg.max_num_seqs,
                         max_num_batched_tokens=cfg.max_num_batched_tokens,
                         gpu_memory_utilization=cfg.gpu_memory_utilization, name=name)
    if backend.get("type") == "llama_server":
        from agentflow.llm.llamacpp_server import configure_engine

        configure_engine(engine, backend, model)
    return engine
