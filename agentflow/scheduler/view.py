"""The cluster as dispatch and queue policies read it (``policies.base.SchedulerView``):
expected call times, outstanding work, batch and KV room, prefix savings — as numpy vectors
over the instances, with the caches that keep them cheap at every decision.

``ClusterView`` is the coordinator's base class: the coordinator owns the queues and the
load book and moves them at events; the view only reads them. Its caches are keyed by
``_models_epoch``, which the coordinator bumps when a time model learns or an instance goes
up or down, so a cluster of hundreds of instances is summed again only then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from agentflow.scheduler import classes
from agentflow.scheduler.call import ScheduledCall
from agentflow.scheduler.cluster import InstanceSpec
from agentflow.scheduler.instance import InstanceQueue, LoadBook
from agentflow.scheduler.policies.base import BatchView
from agentflow.scheduler.time_model import InstanceTimeModel

if TYPE_CHECKING:
    from agentflow.scheduler.prefix_index import PrefixIndex


class ClusterView:
    # Moved by the coordinator's events; read here.
    loads: LoadBook
    queues: dict[str, InstanceQueue]
    prefix_index: PrefixIndex | None

    def _init_view(self, instances: list[InstanceSpec]) -> None:
        """The view's own state, once the coordinator has built ``queues`` in the order of
        ``instances`` (every vector here is in that order)."""
        names = [s.name for s in instances]
        self._index = {s.name: i for i, s in enumerate(instances)}
        self._name_rank = np.argsort(np.argsort(np.array(names, dtype=object)))
        # What a batching engine can hold at once (``batch_view``): call slots and KV tokens.
        self._max_inflight = np.array([s.max_inflight for s in instances], dtype=float)
        self._kv_budget = np.array([s.kv_token_budget if s.kv_token_budget is not None
                                    else np.inf for s in instances], dtype=float)
        self.time_models = _TimeModels(self, {s.name: InstanceTimeModel.for_spec(s)
                                              for s in instances})
        # Bumped whenever a time model learns or an instance goes up/down: the cluster-mean
        # stage-time coefficients are recomputed only then.
        self._models_epoch = 0
        self._mean_coef: tuple[int, float, float, float] | None = None
        self._coef_cache: tuple[Any, ...] | None = None
        self._batch_cache: dict[bool, tuple[Any, ...]] = {}  # clean -> (epoch, arrays)
        self._peer_keys = [s.peer_key for s in instances]
        self._names = names
        self._untried = set(range(len(instances)))  # indices that have answered no call
        self._peer_cache: tuple[int, dict[int, tuple[float, float, float]]] | None = None

    @property
    def up_instances(self) -> list[str]:
        return [name for name, q in self.queues.items() if q.up]

    @property
    def waiting_calls(self) -> int:
        return sum(len(q.waiting) for q in self.queues.values())

    def expected_s(self, call: ScheduledCall, instance: str) -> float:
        model = self.time_models[instance]
        cached = call.time_cache.get(instance)
        borrowed = self._peer_ratios().get(self._index[instance]) \
            if not model.observations else None
        # an instance pricing by its peers' ratios sees them move without learning itself:
        # stamped by the epoch then (negative, apart from its own observation counts)
        stamp = model.observations if borrowed is None else -1 - self._models_epoch
        if cached is None or cached[0] != stamp:
            tokens, out = call.tokens_on(instance), call.mean_output
            time_s = model.expected_s(tokens, out) if borrowed is None else (
                model.overhead_s + tokens * model.prefill_s_per_token * borrowed[0]
                + out * model.decode_s_per_token * borrowed[1])
            cached = (stamp, time_s)
            call.time_cache[instance] = cached
        return cached[1]

    def _peer_ratios(self) -> dict[int, tuple[float, float, float]]:
        """Instances that have finished no call yet, by construction index, with the mean
        (prefill, decode, clean decode) ratios of their peers that have (same GPU, model and
        backend: ``InstanceSpec.peer_key``); refreshed when a model learns.

        Why: an instance that has answered nothing is priced at its starting rates, and its
        twin that has answered at what it measured. Where the two differ — the CPU
        constants on a loaded host, a guess for a scripted backend or a remote endpoint —
        the untried twin looks faster or slower than the one it is identical to, and
        dispatch piles calls on one of them while the other sits idle (issue 39: a keyword
        call timed out on local-0 and ran on local-1; local-1, having measured the loaded
        host, then looked 3x slower than the untried local-0, and all three candidates
        queued on local-0). Its peers' measurements are the best estimate of it, as
        ``call_deadline`` already reads them for its deadlines."""
        cached = self._peer_cache
        if cached is not None and cached[0] == self._models_epoch:
            return cached[1]
        out: dict[int, tuple[float, float, float]] = {}
        names = self._names
        # instances only ever gain answers, so the untried set only shrinks (it is reset
        # when a model is replaced): once all have answered this is O(1) per refresh
        self._untried = {i for i in self._untried
                         if not self.time_models[names[i]].observations}
        if self._untried:
            models = [self.time_models[n] for n in names]
            seen: dict[Any, list[InstanceTimeModel]] = {}
            for key, m in zip(self._peer_keys, models):
                if m.observations:
                    seen.setdefault(key, []).append(m)
            for i in sorted(self._untried):
                peers = seen.get(self._peer_keys[i])
                if peers:
                    out[i] = (float(np.mean([p.prefill_ratio for p in peers])),
                              float(np.mean([p.decode_ratio for p in peers])),
                              float(np.mean([p.clean_decode_ratio for p in peers])))
        self._peer_cache = (self._models_epoch, out)
        return out

    def outstanding_work(self, instance: str, now: float) -> float:
        return float(self.work_vector(now)[self._index[instance]])

    def work_vector(self, now: float) -> np.ndarray:
        """``W_i`` of every instance (construction order): the waiting calls' expected time
        from their token totals, plus what is left of the running calls."""
        oh, pf, df = self._coef_vectors()
        book = self.loads
        work: np.ndarray = (book.n_wait * oh + book.wait_prompt * pf + book.wait_output * df
                            + book.running(now))
        return work

    def time_vector(self, call: ScheduledCall) -> np.ndarray:
        """``t(call, i)`` on every instance (construction order)."""
        oh, pf, df = self._coef_vectors()
        prompt: float | np.ndarray = call.prompt_tokens
        if call.prompt_tokens_on:  # tokenizers disagree: each instance's own count
            prompt = np.array([call.tokens_on(n) for n in self.queues], dtype=float)
        return oh + prompt * pf + call.mean_output * df

    def dispatch_view(self, call: ScheduledCall, instances: list[str], now: float
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(W, t, name rank) for ``instances``, aligned with that list: what every dispatch
        policy reads, in a few vector operations whatever the cluster size."""
        idx = [self._index[n] for n in instances]
        work = self.work_vector(now)
        behind = self._work_behind(call)
        if behind is not None:
            work = work - behind
        return work[idx], self.time_vector(call)[idx], self._name_rank[idx]

    def _work_behind(self, call: ScheduledCall) -> np.ndarray | None:
        """Waiting work of worse bands per instance, which ``call`` would jump (None: none,
        or the queue policy does not rank by class; ``scheduler.classes.ClassLoad``)."""
        load = getattr(self, "_class_load", None)
        if load is None:
            return None
        behind: np.ndarray | None = load.behind_s(call, self._coef_vectors())
        return behind

    def batch_view(self, call: ScheduledCall, instances: list[str], now: float) -> BatchView:
        """How each of ``instances`` would take ``call`` now, as arrays aligned with the list:
        see ``BatchView``."""
        idx = [self._index[n] for n in instances]
        oh, pf, df = self._coef_vectors()
        book = self.loads
        queued_all = book.n_wait * oh + book.wait_prompt * pf + book.wait_output * df
        behind = self._work_behind(call)
        queued = (queued_all if behind is None else queued_all - behind)[idx]
        prompt: float | np.ndarray = call.prompt_tokens
        if call.prompt_tokens_on:
            prompt = np.array([call.tokens_on(n) for n in instances], dtype=float)
        n_run = book.n_run[idx]
        need = prompt + self._output_reserve(call)  # as ``_kv_tokens``, on each instance
        room = (n_run < self._max_inflight[idx]) & (
            (n_run == 0) | (book.kv_used[idx] + need <= self._kv_budget[idx]))
        time_s = self.time_vector(call)[idx]
        rate = df  # decode seconds per output token that ``time_s`` holds
        if self._shielded(call):  # its decode as the gate keeps it
            rate, slope, seen = self._batch_coefs(clean=True)
            time_s = time_s + call.mean_output * (rate - df)[idx]
        else:
            _, slope, seen = self._batch_coefs()
        solo_s = time_s + call.mean_output * (np.minimum(rate, self._solo_df()) - rate)[idx]
        return BatchView(queued_s=queued, prefilling_s=book.prefill_prompt[idx] * pf[idx],
                         running_s=book.running(now)[idx], n_running=n_run,
                         room=room, slots=self._max_inflight[idx],
                         time_s=time_s, prefill_s=prompt * pf[idx],
                         co_runner_decode_s=call.mean_output * slope[idx],
                         co_runners_seen=seen[idx], name_rank=self._name_rank[idx],
                         n_peers=self._peers(call, idx), solo_s=solo_s)

    def _peers(self, call: ScheduledCall, idx: list[int]) -> np.ndarray | None:
        load = getattr(self, "_class_load", None)
        return None if load is None else load.peers_running(call)[idx]

    def _batch_coefs(self, clean: bool = False
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per instance: decode seconds per output token, the decode seconds per output token
        that each co-runner adds (the learned ``InstanceTimeModel.co_runner_slope``, a decode
        ratio, times the model's base decode rate, which the ratio is relative to), and the
        mean co-runners the ratio was learned at; refreshed when a time model learns.
        ``clean``: all three learned net of the prefill chunks calls sat through
        (``InstanceTimeModel.clean_decode_ratio``; see ``_shielded`` for who is priced so)."""
        cached = self._batch_cache.get(clean)
        if cached is None or cached[0] != self._models_epoch:
            models = [self.time_models[n] for n in self.queues]
            fits = [m.co_runner_slope(clean=clean) for m in models]
            borrowed = self._peer_ratios()
            ratios = [(m.clean_decode_ratio if clean else m.decode_ratio) if i not in borrowed
                      else borrowed[i][2 if clean else 1] for i, m in enumerate(models)]
            cached = self._batch_cache[clean] = (
                self._models_epoch,
                np.array([m.decode_s_per_token * r for m, r in zip(models, ratios)]),
                np.array([m.decode_s_per_token * f[0] for m, f in zip(models, fits)]),
                np.array([f[1] for f in fits]))
        return cached[1], cached[2], cached[3]

    def _solo_df(self) -> np.ndarray:
        """Per instance: decode seconds per output token of a call running alone, by the
        profile (the base rate the learned ratios are relative to). Why it bounds the
        co-runner correction: the slope is a straight line fitted where the calls ran
        (under a flood, 3-10 co-runners), and read at fewer co-runners it falls below the
        solo rate and even below 0 where the slope is steep (the MoE instances, whose
        expert union grows fastest with the first co-runners): mixed-qwen, 2 x L1, seed 1,
        priced a 12k-token candidate at 0.7 s on an idle A40 that then took 13.1 s. It bounds
        every call's correction, on the plain ratio as on the clean one: the line undercuts
        the solo rate whatever queue ranks the call."""
        return np.array([self.time_models[n].decode_s_per_token for n in self.queues])

    def _shielded(self, call: ScheduledCall) -> bool:
        """Whether the headroom gate keeps worse-band prefill from starting beside ``call``:
        the gate is installed (``flowsage``'s fair class queue, with ``ISOLATE_PREFILL``)
        and worse-band calls are in flight (``ClassLoad.worse_in_flight``). A class-ranked
        queue without the gate (``fcfs``) lets worse-band prefill start beside it, so its
        calls keep the plain ratio, which holds those stalls. Why a shielded call is priced
        with the clean coefficients: the stalls in the plain ratio are mostly lower-band
        calls' prefill beside lower-band decodes (they are most of the finished calls under a
        flood), which the gate keeps away from it; the prefill its own band admits beside it
        is charged by dispatch to the call that brings it (``marginal_delay``'s inflicted
        term), so the plain ratio counts it twice."""
        load = getattr(self, "_class_load", None)
        return (load is not None and bool(getattr(self, "_fair", False))
                and classes.ISOLATE_PREFILL and load.worse_in_flight(call))

    def prefix_saved_s(self, call: ScheduledCall, instances: list[str]) -> np.ndarray:
        """Expected prefill seconds ``call`` would skip on each of ``instances``: the prompt
        tokens the router-side prefix index believes each holds, at its prefill rate."""
        if self.prefix_index is None or not call.prefix_hashes:
            return np.zeros(len(instances))
        blocks = self.prefix_index.matched_blocks(call.prefix_hashes, instances)
        tokens = np.array([call.prefix_tokens(b) for b in blocks], dtype=float)
        pf = self._coef_vectors()[1]
        saved: np.ndarray = tokens * pf[[self._index[n] for n in instances]]
        return saved

    def _coef_vectors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-instance overhead, prefill and decode seconds per token (with the online
        corrections), refreshed only when a time model learns."""
        cached = self._coef_cache
        key = self._models_epoch
        if cached is None or cached[0] != key:
            models = [self.time_models[n] for n in self.queues]
            borrowed = self._peer_ratios()  # untried instances: their peers' ratios
            ratios = [(m.prefill_ratio, m.decode_ratio) if i not in borrowed
                      else borrowed[i][:2] for i, m in enumerate(models)]
            cached = self._coef_cache = (
                key, np.array([m.overhead_s for m in models]),
                np.array([m.prefill_s_per_token * r[0] for m, r in zip(models, ratios)]),
                np.array([m.decode_s_per_token * r[1] for m, r in zip(models, ratios)]))
        return cached[1], cached[2], cached[3]

    def _mean_time(self, prompt_tokens: float, output_tokens: float) -> float:
        """A stage's time averaged over the cluster's up instances (HexGen-Flow's budget
        estimate, since the stage's instance is not chosen yet)."""
        oh, pf, df = self._mean_coefs()
        return oh + prompt_tokens * pf + output_tokens * df

    def _mean_coefs(self) -> tuple[float, float, float]:
        """The time models are linear in tokens, so their average over the up instances (all
        when none is up) is the mean of their coefficients (``_coef_vectors``), refreshed
        when a model learns or an instance goes up or down."""
        coef = self._mean_coef
        key = self._models_epoch
        if coef is None or coef[0] != key:
            up = [q.up for q in self.queues.values()]
            vectors: tuple[np.ndarray, ...] = self._coef_vectors()
            if any(up):
                vectors = tuple(v[up] for v in vectors)
            k = len(vectors[0])
            coef = self._mean_coef = (key, *(sum(v.tolist()) / k for v in vectors))
        return coef[1], coef[2], coef[3]

    def _kv_tokens(self, call: ScheduledCall) -> int:
        """KV-cache tokens a call may hold on its instance: prompt + ``_output_reserve``."""
        return int(call.tokens_on(call.instance) + self._output_reserve(call))

    @staticmethod
    def _output_reserve(call: ScheduledCall) -> float:
        """Output tokens to hold KV for: the 90th percentile of the predicted length, given
        what the call has written so far (``attained_tokens``) — once past that percentile,
        the 90th percentile of the lengths above it, and once past every length the
        prediction allows, the next progress report (twice what it has written)."""
        output, written = call.output, call.attained_tokens
        if written <= 0:
            return output.quantile(0.9)
        if output.survival(written) > 0:
            return max(output.conditional_above(written).quantile(0.9), written)
        return 2 * written


class _TimeModels(dict[str, InstanceTimeModel]):
    """The view's time models by instance; replacing one (tests, calibration) marks the
    cached cluster-wide coefficients stale, as learning does."""

    def __init__(self, owner: ClusterView, models: dict[str, InstanceTimeModel]):
        super().__init__(models)
        self._owner = owner

    def __setitem__(self, name: str, model: InstanceTimeModel) -> None:
        super().__setitem__(name, model)
        owner = self.__dict__.get("_owner")  # absent while copy.deepcopy rebuilds the dict
        if owner is not None and hasattr(owner, "_models_epoch"):
            owner._models_epoch += 1
            owner._untried = set(range(len(owner._names)))  # the new model may be untried
