"""The cluster as dispatch and queue policies read it (``policies.base.SchedulerView``):
expected call times, outstanding work, batch and KV room, prefix savings — as numpy vectors
over the instances, with the caches that keep them cheap at every decision.

``ClusterView`` is the coordinator's base class: the coordinator owns the queues and the
load book and moves them at events; the view only reads them.

Why its caches are kept row by row: a decision's cost must not grow with the fleet. The
per-instance coefficients every decision reads (overhead, prefill and decode seconds per
token, the co-runner slopes, the solo decode rate) live in arrays over all instances; a
finished call teaches one instance's time model, so ``_model_learned`` rewrites that one
instance's row (the same float expressions as a full build, so the arrays are identical to
rebuilding them), instead of throwing the arrays of 1,024 instances away at every finish.
The list of up instances and its index vector depend only on the instance set and are kept
until an instance goes up or down (``_instances_changed``). ``_models_epoch`` is the blunt
tool kept for whoever edits time models in place (tests, calibration): bumping it rebuilds
every array at the next read.

An instance that has answered nothing is priced by its answered peers' mean ratios
(``_borrowed``), so one learn moves the rows of all its untried peers — 800 of them on a
4,096-instance fleet. Those rows are alike: untried peers with the same starting model form
a block (``_blocks``), whose one value is written into the arrays as a numpy slice
assignment and into the exact cluster sums as one block (``ExactColumnMeans.set_block``),
and the group's borrowed ratios are one cached mean per learn of the group, read from an
array of the answered members' ratios. So a learn costs the same on 64 instances as on 4,096
and the arrays stay the ones a row-by-row rebuild writes.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import numpy as np

from agentflow.scheduler import classes, price_kernel
from agentflow.scheduler.call import ScheduledCall
from agentflow.scheduler.cluster import InstanceSpec
from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.exact_mean import ExactColumnMeans
from agentflow.scheduler.instance import InstanceQueue
from agentflow.scheduler.loadbook import LoadBook
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
        self._names = names
        self._name_rank = np.argsort(np.argsort(np.array(names, dtype=object)))
        # What a batching engine can hold at once (``batch_view``): call slots and KV tokens.
        self._max_inflight = np.array([s.max_inflight for s in instances], dtype=float)
        self._kv_budget = np.array([s.kv_token_budget if s.kv_token_budget is not None
                                    else np.inf for s in instances], dtype=float)
        self._kv_unbounded = bool(np.isposinf(self._kv_budget).all())
        self.time_models = _TimeModels(self, {s.name: InstanceTimeModel.for_spec(s)
                                              for s in instances})
        # Bumped when time models are replaced or edited outside ``observe`` (tests,
        # calibration): every coefficient row is rebuilt at the next read.
        self._models_epoch = 0
        self._rows_epoch = -1  # the epoch the rows below were built at
        self._stale_rows: set[int] = set()  # rows whose model learned since they were read
        n = len(instances)
        # per instance (construction order): overhead, prefill and decode s/token with the
        # online corrections; per ``clean``: decode s/token, co-runner slope, mean co-runners
        # (``_batch_coefs``); the profile's solo decode s/token (``_solo_df``)
        self._oh, self._pf, self._df = np.zeros(n), np.zeros(n), np.zeros(n)
        self._batch_rows = {clean: (np.zeros(n), np.zeros(n), np.zeros(n))
                            for clean in (False, True)}
        self._solo = np.zeros(n)
        # exact column sums of (overhead, prefill, decode) over the up instances, moved row
        # by row (``exact_mean``), and their means; None: stale
        self._sums = ExactColumnMeans(n, 3)
        self._mean_coef: tuple[float, float, float] | None = None
        # (up instance names, their indices: a slice when all are up) until one goes up/down
        self._up: tuple[list[str], slice | np.ndarray] | None = None
        # Peers (same GPU, model and backend: ``InstanceSpec.peer_key``) by key, the members
        # that have answered no call yet, and a count of the group's learns (which moves the
        # ratios its untried members borrow: ``_borrowed``)
        self._peer_keys = [s.peer_key for s in instances]
        self._groups: dict[tuple[str | None, ...], list[int]] = {}
        for i, key in enumerate(self._peer_keys):
            self._groups.setdefault(key, []).append(i)
        self._untried: set[int] = set(range(n))
        self._group_learns: dict[tuple[str | None, ...], int] = dict.fromkeys(self._groups, 0)
        # Per group: its answered members in index order, and their borrowed mean ratios
        # (with the group's learn count they were taken at); the untried members by
        # starting model (``_block_key``), as index arrays; groups whose untried blocks
        # must be rewritten at the next read. Each instance's own (prefill, decode, clean
        # decode) ratios, as its row last read them (the borrowed means are sums of these).
        self._answered: dict[tuple[str | None, ...], list[int]] = {}
        self._borrow_cache: dict[tuple[str | None, ...],
                                 tuple[int, tuple[float, float, float] | None]] = {}
        self._blocks: dict[tuple[str | None, ...], dict[tuple[float, ...], np.ndarray]] = {}
        self._stale_groups: set[tuple[str | None, ...]] = set()
        self._own_ratios = np.ones((3, n))
        # Per group, its answered members' own (prefill, decode, clean decode) ratios as
        # Python floats, aligned with ``_answered`` (what ``_group_borrowed`` sums, kept
        # there so a read does not gather and convert them); each untried member's block.
        self._answered_ratios: dict[tuple[str | None, ...], tuple[list[float], ...]] = {}
        self._block_of: dict[int, tuple[float, ...]] = {}

    @property
    def up_instances(self) -> list[str]:
        """The up instances in construction order. Cached until an instance goes up or down
        (``_instances_changed``): callers read the list, never change it."""
        return self._up_set()[0]

    def _up_set(self) -> tuple[list[str], slice | np.ndarray]:
        up = self._up
        if up is None:
            names = [name for name, q in self.queues.items() if q.up]
            index: slice | np.ndarray = slice(None) if len(names) == len(self.queues) \
                else np.array([self._index[n] for n in names], dtype=np.intp)
            up = self._up = (names, index)
        return up

    def _instances_changed(self) -> None:
        """An instance went up or down: the up list and the cluster mean are stale."""
        self._up = None
        self._sums.set_counted([q.up for q in self.queues.values()])
        self._mean_coef = None

    def _model_learned(self, instance: str) -> None:
        """``instance``'s time model learned from a finished call: its row is rewritten at
        the next read (from the model as it is then, as a rebuild would read it)."""
        i = self._index[instance]
        self._stale_rows.add(i)
        self._mean_coef = None
        key = self._peer_keys[i]
        self._group_learns[key] += 1
        if i in self._untried:  # its first answer: out of its block, among the answered
            self._untried.discard(i)
            self._leave_block(i)
            answered = self._answered.setdefault(key, [])
            at = bisect.bisect_left(answered, i)
            answered.insert(at, i)
            for column in self._answered_ratios.setdefault(key, ([], [], [])):
                column.insert(at, 1.0)  # its row is stale: written at the next read
        if self._blocks.get(key):  # its untried peers price by its ratios: theirs move too
            self._stale_groups.add(key)

    def _positions(self, instances: list[str]) -> slice | np.ndarray:
        """Indices of ``instances`` into the per-instance arrays: a slice (a view, no copy)
        when they are the cached up list of a cluster whose instances are all up."""
        up = self._up
        if up is not None and instances is up[0]:
            return up[1]
        return np.array([self._index[n] for n in instances], dtype=np.intp)

    @property
    def waiting_calls(self) -> int:
        """Calls waiting in every instance's queue: the load book's per-instance counts
        (whole numbers in floats, so the sum is exact), one numpy sum instead of a walk
        over 1,024 queues at every arrival."""
        return int(self.loads.n_wait.sum())

    def expected_s(self, call: ScheduledCall, instance: str) -> float:
        model = self.time_models[instance]
        cached = call.time_cache.get(instance)
        i = self._index[instance]
        borrowed = self._borrowed(i, model) if not model.observations else None
        # an instance pricing by its peers' ratios sees them move without learning itself:
        # stamped by its group's learns then (negative, apart from its own answer counts)
        stamp = model.observations if borrowed is None \
            else -1 - self._group_learns[self._peer_keys[i]]
        if cached is None or cached[0] != stamp:
            tokens, out = call.tokens_on(instance), call.mean_output
            time_s = model.expected_s(tokens, out) if borrowed is None else (
                model.overhead_s + tokens * model.prefill_s_per_token * borrowed[0]
                + out * model.decode_s_per_token * borrowed[1])
            cached = (stamp, time_s)
            call.time_cache[instance] = cached
        return cached[1]

    def _borrowed(self, i: int, model: InstanceTimeModel) -> tuple[float, float, float] | None:
        """For an instance that has finished no call (``model``: its time model), the mean
        (prefill, decode, clean decode) ratios of its peers that have (same GPU, model and
        backend: ``InstanceSpec.peer_key``); None once it has answered, or no peer has.
        One mean per group, kept until the group learns again (``_group_borrowed``).

        Why: an instance that has answered nothing is priced at its starting rates, and its
        twin that has answered at what it measured. Where the two differ — the CPU
        constants on a loaded host, a guess for a scripted backend or a remote endpoint —
        the untried twin looks faster or slower than the one it is identical to, and
        dispatch piles calls on one of them while the other sits idle (issue 39: a keyword
        call timed out on local-0 and ran on local-1; local-1, having measured the loaded
        host, then looked 3x slower than the untried local-0, and all three candidates
        queued on local-0). Its peers' measurements are the best estimate of it, as
        ``call_deadline`` already reads them for its deadlines."""
        if model.observations:
            return None
        self._sync()
        return self._group_borrowed(self._peer_keys[i])

    def _group_borrowed(self, key: tuple[str | None, ...]
                        ) -> tuple[float, float, float] | None:
        """The mean ratios of group ``key``'s answered members (None: none has answered),
        summed in index order as a plain float sum, so the same floats as summing over
        their time models; recomputed only after the group learned."""
        learns = self._group_learns[key]
        cached = self._borrow_cache.get(key)
        if cached is not None and cached[0] == learns:
            return cached[1]
        answered = self._answered.get(key)
        borrowed = None
        if answered:
            self._flush_rows()  # the answered rows' own ratios as their models hold them
            k = len(answered)
            r0, r1, r2 = self._answered_ratios[key]  # = self._own_ratios[:, answered]
            borrowed = (sum(r0) / k, sum(r1) / k, sum(r2) / k)
        self._borrow_cache[key] = (learns, borrowed)
        return borrowed

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
        idx = self._positions(instances)
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
        idx = self._positions(instances)
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

    def marginal_price(self, call: ScheduledCall, instances: list[str], now: float
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``_marginal_price_numpy``'s result: by the compiled loop where numba is installed
        (``scheduler.price_kernel``: the same floats, per instance), else by numpy."""
        if price_kernel.enabled():
            return self._marginal_price_loop(call, instances, now)
        return self._marginal_price_numpy(call, instances, now)

    def _marginal_price_loop(self, call: ScheduledCall, instances: list[str], now: float
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``_marginal_price_numpy`` by ``price_kernel``'s loop: the same inputs read in the
        same order (the worse-band work behind, the KV need, the expiry wheel's retirements,
        the shield, the rows, the peers), the per-instance arithmetic compiled, and the held
        progress reports settled where the room test needs them, as ``_kv_fits`` does."""
        idx = self._positions(instances)
        oh, pf, df = self._coef_vectors()
        book = self.loads
        behind = self._work_behind(call)
        empty = price_kernel.EMPTY
        prompt_v = need_v = empty
        need: float | np.ndarray
        if call.prompt_tokens_on:  # tokenizers disagree: each instance's own count
            prompt_v = np.array([call.tokens_on(n) for n in self.queues], dtype=float)
            need = need_v = prompt_v + self._output_reserve(call)
            need_s = 0.0
        else:
            need = call.prompt_tokens + self._output_reserve(call)
            need_s = float(need)
        check_kv = not (self._kv_unbounded and isinstance(need, float) and need == need)
        book.retire_due(now)  # as ``book.running(now)``
        shielded = self._shielded(call)
        if shielded:
            rate, slope, seen = self._batch_coefs(clean=True)
        else:
            rate = df
            _, slope, seen = self._batch_coefs()
        load = getattr(self, "_class_load", None)
        peers = empty if load is None else load.peers_running(call)
        n = oh.shape[0]
        price, co = np.empty(n), np.empty(n)
        args = [book.n_wait, book.wait_prompt, book.wait_output, oh, pf, df,
                empty if behind is None else behind, book.prefill_prompt,
                prompt_v, float(call.prompt_tokens), need_v, need_s, check_kv,
                check_kv and bool(book.kv_folded), book.kv_settled, book.kv_pending,
                self._kv_budget, book.n_run, self._max_inflight, book.finish_sum,
                book.finish_n, float(now), float(call.mean_output), rate, shielded, slope,
                seen, self._solo_df(), peers, price, co]
        if price_kernel.price_loop(*args):  # held reports could change the room test
            kv, budget = book.kv_settled, self._kv_budget
            fits = kv + need <= budget  # ``_kv_fits``: settle where unsure, then test again
            top = kv + book.kv_pending
            top += need
            book.settle_kv((fits & (top > budget)).nonzero()[0].tolist())
            args[13] = False
            price_kernel.price_loop(*args)
        if isinstance(idx, slice):
            return price, co, self._name_rank
        return price[idx], co[idx], self._name_rank[idx]

    def _marginal_price_numpy(self, call: ScheduledCall, instances: list[str], now: float
                              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``marginal_delay``'s price of each of ``instances`` for ``call`` (before the
        seconds an instance waives: ``saved_s``), the co-runners it would run beside, and
        the name rank: the same floats as ``MarginalDelayDispatch.price_s`` reading
        ``batch_view``, computed in one pass.

        Why: dispatch read a ``BatchView`` of twelve arrays, each built and indexed apart,
        and then combined them: ~50 vector operations per decision, a fleet-sized cost
        (1,024 to 4,096 floats each, most of them out of cache between decisions). Here
        each term is computed once over every instance, in place where it can be, with
        the expressions ``batch_view`` and ``price_s`` write, in their order (every operation
        is elementwise, so the floats are the ones the aligned arrays gave), and indexed by
        ``instances`` once at the end. ``tests/scheduler/test_decide_exact.py`` compares the
        two bit for bit at every dispatch of seeded replays."""
        idx = self._positions(instances)
        oh, pf, df = self._coef_vectors()
        book = self.loads
        n_run = book.n_run
        # wait: the queued work (less the worse bands it jumps), the prompts not yet
        # prefilled and, without room, the mean remainder of the running calls
        wait = book.n_wait * oh
        wait += book.wait_prompt * pf
        wait += book.wait_output * df
        behind = self._work_behind(call)
        if behind is not None:
            wait -= behind
        wait += book.prefill_prompt * pf
        prompt: float | np.ndarray = call.prompt_tokens
        if call.prompt_tokens_on:  # tokenizers disagree: each instance's own count
            prompt = np.array([call.tokens_on(n) for n in self.queues], dtype=float)
        need = prompt + self._output_reserve(call)
        room = n_run < self._max_inflight
        if not (self._kv_unbounded and isinstance(need, float) and need == need):
            # (with every budget infinite and ``need`` a number, the KV test holds everywhere)
            room &= (n_run == 0) | self._kv_fits(need)
        stall = book.running(now)
        stall /= np.maximum(n_run, 1.0)
        stall[room] = 0.0
        wait += stall
        # the call's own time there, corrected to its co-runners, floored at its solo time
        out = call.mean_output
        prefill = prompt * pf
        own = oh + prefill
        own += out * df
        rate = df
        if self._shielded(call):  # its decode as the gate keeps it
            rate, slope, seen = self._batch_coefs(clean=True)
            own += out * (rate - df)
        else:
            _, slope, seen = self._batch_coefs()
        solo = own + out * (np.minimum(rate, self._solo_df()) - rate)
        slots = self._max_inflight - 1.0
        co = np.minimum(n_run, slots)
        d = out * slope  # decode seconds one more co-runner adds to the call
        own += d * (co - seen)
        np.maximum(own, solo, out=own)
        # the delay it inflicts on the co-runners it does not outrank
        load = getattr(self, "_class_load", None)
        prefill += d
        prefill *= co if load is None else np.minimum(load.peers_running(call), slots)
        wait += own
        wait += prefill
        if isinstance(idx, slice):
            return wait, co, self._name_rank
        return wait[idx], co[idx], self._name_rank[idx]

    def _peers(self, call: ScheduledCall, idx: slice | np.ndarray) -> np.ndarray | None:
        load = getattr(self, "_class_load", None)
        return None if load is None else load.peers_running(call)[idx]

    def _batch_coefs(self, clean: bool = False
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per instance: decode seconds per output token, the decode seconds per output token
        that each co-runner adds (the learned ``InstanceTimeModel.co_runner_slope``, a decode
        ratio, times the model's base decode rate, which the ratio is relative to), and the
        mean co-runners the ratio was learned at; a row is rewritten when its model learns.
        ``clean``: all three learned net of the prefill chunks calls sat through
        (``InstanceTimeModel.clean_decode_ratio``; see ``_shielded`` for who is priced so)."""
        self._coef_vectors()  # rows current
        return self._batch_rows[clean]

    def _solo_df(self) -> np.ndarray:
        """Per instance: decode seconds per output token of a call running alone, by the
        profile (the base rate the learned ratios are relative to). Why it bounds the
        co-runner correction: the slope is a straight line fitted where the calls ran
        (under a flood, 3-10 co-runners), and read at fewer co-runners it falls below the
        solo rate and even below 0 where the slope is steep (the MoE instances, whose
        expert union grows fastest with the first co-runners): mixed-qwen, 2 x L1, seed 1,
        priced a 12k-token candidate at 0.7 s on an idle A40 that then took 13.1 s. It bounds
        every call's correction, on the plain ratio as on the clean one: the line undercuts
        the solo rate whatever queue ranks the call. Kept with the other rows (it moves
        only when a model is replaced)."""
        self._coef_vectors()  # rows current
        return self._solo

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
        corrections): the current rows (every row rebuilt after ``_models_epoch`` moved)."""
        self._sync()
        if self._stale_rows:
            self._flush_rows()
        if self._stale_groups:
            for key in self._stale_groups:
                self._write_blocks(key)
            self._stale_groups.clear()
        return self._oh, self._pf, self._df

    def _sync(self) -> None:
        """After ``_models_epoch`` moved: which instances have answered (from their models),
        the groups' answered lists and untried blocks, and every row, rebuilt."""
        if self._rows_epoch == self._models_epoch:
            return
        self._rows_epoch = self._models_epoch
        models = [self.time_models[name] for name in self._names]
        self._untried = {i for i, m in enumerate(models) if not m.observations}
        self._answered, self._blocks, self._borrow_cache = {}, {}, {}
        self._block_of = {}
        members: dict[tuple[str | None, ...], dict[tuple[float, ...], list[int]]] = {}
        for i, m in enumerate(models):
            key = self._peer_keys[i]
            if i in self._untried:
                b = self._block_of[i] = self._block_key(m)
                members.setdefault(key, {}).setdefault(b, []).append(i)
            else:
                self._answered.setdefault(key, []).append(i)
        self._answered_ratios = {key: ([1.0] * len(a), [1.0] * len(a), [1.0] * len(a))
                                 for key, a in self._answered.items()}
        self._blocks = {key: {b: np.array(idx, dtype=np.intp) for b, idx in blocks.items()}
                        for key, blocks in members.items()}
        for i, m in enumerate(models):  # the answered rows, and every row's own entries
            self._fill_row(i, m)
        for group, blocks in self._blocks.items():  # untried rows: their block's value
            for b, idx in blocks.items():
                for i in idx.tolist():
                    self._sums.join_block(i, (group, b))
        self._stale_rows.clear()
        self._stale_groups = set(self._blocks)
        for group in self._stale_groups:
            self._write_blocks(group)
        self._stale_groups.clear()
        self._mean_coef = None

    def _flush_rows(self) -> None:
        """Rewrite the rows of the instances that learned since the last read."""
        if self._stale_rows:
            for i in self._stale_rows:
                self._fill_row(i, self.time_models[self._names[i]])
            self._stale_rows.clear()

    @staticmethod
    def _block_key(m: InstanceTimeModel) -> tuple[float, ...]:
        """What makes two untried peers' rows equal whatever their peers measure: the
        starting model's constants and (for a group nobody has answered in) own ratios."""
        return (m.overhead_s, m.prefill_s_per_token, m.decode_s_per_token,
                m.prefill_ratio, m.decode_ratio, m.clean_decode_ratio)

    def _leave_block(self, i: int) -> None:
        """Instance ``i`` answered its first call: out of its group's untried block."""
        b = self._block_of.pop(i, None)
        if b is None:
            return
        blocks = self._blocks[self._peer_keys[i]]
        idx = blocks[b]
        rest = idx[idx != i]
        if len(rest):
            blocks[b] = rest
        else:
            del blocks[b]

    def _fill_row(self, i: int, m: InstanceTimeModel) -> None:
        """Instance ``i``'s entries in every coefficient array, from its time model (one
        expression per entry, the same whether one row or all are written). An untried
        row's ratio-dependent entries and its place in the sums are its block's
        (``_write_blocks``)."""
        own = (m.prefill_ratio, m.decode_ratio, m.clean_decode_ratio)
        self._own_ratios[:, i] = own
        self._oh[i] = m.overhead_s
        self._solo[i] = m.decode_s_per_token
        for clean, (_, slope, seen) in self._batch_rows.items():
            fit = m.co_runner_slope(clean=clean)
            slope[i] = m.decode_s_per_token * fit[0]
            seen[i] = fit[1]
        if i in self._untried:
            return
        key = self._peer_keys[i]
        at = bisect.bisect_left(self._answered[key], i)
        for column, x in zip(self._answered_ratios[key], own):
            column[at] = float(x)
        self._pf[i] = m.prefill_s_per_token * own[0]
        self._df[i] = m.decode_s_per_token * own[1]
        self._sums.set_row(i, (self._oh[i], self._pf[i], self._df[i]))
        for clean, (rate, _, _) in self._batch_rows.items():
            rate[i] = m.decode_s_per_token * (own[2] if clean else own[1])

    def _write_blocks(self, key: tuple[str | None, ...]) -> None:
        """The untried rows of group ``key``, block by block: the same expressions as a
        row's own (``_fill_row``), with the peers' mean ratios (else the block's own), once
        per block, assigned to all its rows."""
        blocks = self._blocks.get(key)
        if not blocks:
            return
        borrowed = self._group_borrowed(key)
        for b, idx in blocks.items():
            oh, prefill_s, decode_s = b[0], b[1], b[2]
            prefill_ratio, decode_ratio, clean_ratio = borrowed if borrowed is not None \
                else (b[3], b[4], b[5])
            pf, df = prefill_s * prefill_ratio, decode_s * decode_ratio
            self._pf[idx], self._df[idx] = pf, df
            self._batch_rows[False][0][idx] = decode_s * decode_ratio
            self._batch_rows[True][0][idx] = decode_s * clean_ratio
            self._sums.set_block((key, b), (oh, pf, df))
        self._mean_coef = None

    def _mean_time(self, prompt_tokens: float, output_tokens: float) -> float:
        """A stage's time averaged over the cluster's up instances (HexGen-Flow's budget
        estimate, since the stage's instance is not chosen yet)."""
        oh, pf, df = self._mean_coefs()
        return oh + prompt_tokens * pf + output_tokens * df

    def _mean_coefs(self) -> tuple[float, float, float]:
        """The time models are linear in tokens, so their average over the up instances (all
        when none is up) is the mean of their coefficients (``_coef_vectors``). Kept as exact
        sums (``ExactColumnMeans``) that a learn moves by one row, so reading it costs the
        same on 4 instances as on 4,096; the mean is the exact one, rounded once.

        The common read is one check and a tuple return: every path that makes a row stale
        (``_model_learned``, ``_write_blocks``, ``_instances_changed``, ``_sync``) clears
        ``_mean_coef``, and a replaced model moves ``_models_epoch``, so a kept mean at the
        rows' epoch is current without asking ``_coef_vectors`` (3-4% of a simulator run
        did that check, once per paths pass)."""
        coef = self._mean_coef
        if coef is not None and self._rows_epoch == self._models_epoch:
            return coef
        self._coef_vectors()  # rows current (a rebuild marks the mean stale)
        means = self._sums.means()
        coef = self._mean_coef = (means[0], means[1], means[2])
        return coef

    def _kv_fits(self, need: float | np.ndarray) -> np.ndarray:
        """``kv_used + need <= budget`` per instance, pricing held progress reports
        (``InstanceQueue.note_progress``) only on instances where they could change the
        answer: the held reports only add KV, at most ``kv_pending``, so an instance that
        does not fit without them does not fit with them, and one that fits with the bound
        added fits (float addition is monotone, and the KV totals are whole tokens, so
        ``kv_settled + kv_pending`` is exact). The rest are settled and tested again: the
        same booleans as testing the settled totals everywhere."""
        book, budget = self.loads, self._kv_budget
        kv = book.kv_settled
        fits: np.ndarray = kv + need <= budget
        if book.kv_folded:
            top = kv + book.kv_pending
            top += need
            unsure = fits & (top > budget)
            if unsure.any():
                book.settle_kv(unsure.nonzero()[0].tolist())
                fits = kv + need <= budget  # the same array, settled where it was unsure
        return fits

    def _kv_tokens(self, call: ScheduledCall) -> int:
        """KV-cache tokens a call may hold on its instance: prompt + ``_output_reserve``."""
        return self._kv_tokens_at(call, call.attained_tokens)

    def _kv_tokens_at(self, call: ScheduledCall, written: int) -> int:
        """``_kv_tokens`` of ``call`` as of a report of ``written`` output tokens (what it
        reads as ``attained_tokens`` then): how a held report is priced when settled."""
        return int(call.tokens_on(call.instance) + self._reserve_at(call.output, written))

    def _kv_tokens_at_most(self, call: ScheduledCall, written: list[int]) -> int:
        """The most ``_kv_tokens_at(call, w)`` gives over ``written`` (non-empty): the
        prompt read once, the reserves compared before the sum. The same int: ``prompt +
        r`` (rounded to nearest) and ``int`` are non-decreasing in ``r``, so the maximum
        of the sums is the sum at the maximum reserve."""
        output = call.output
        best = max(self._reserve_at(output, w) for w in written)
        return int(call.tokens_on(call.instance) + best)

    @staticmethod
    def _output_reserve(call: ScheduledCall) -> float:
        """Output tokens to hold KV for: the 90th percentile of the predicted length, given
        what the call has written so far (``attained_tokens``) — once past that percentile,
        the 90th percentile of the lengths above it, and once past every length the
        prediction allows, the next progress report (twice what it has written)."""
        return ClusterView._reserve_at(call.output, call.attained_tokens)

    @staticmethod
    def _reserve_at(output: Distribution, written: int) -> float:
        """``_output_reserve`` of a call predicted ``output`` that has written ``written``."""
        if written <= 0:
            return output.quantile(0.9)
        above = output.quantile_above(written, 0.9)  # None: written past its last atom
        if above is not None:
            return max(above, written)
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
            owner._models_epoch += 1  # every row is rebuilt at the next read
