"""Expected time of an LLM call on an instance: ``t(s, i)`` in HexGen-Flow's rules.

A call's time is prefill (linear in uncached prompt tokens) plus decode (linear in output
tokens). Starting points come from the hardware profile, through the simulator's operator
step model (``agentflow.step_time``: per token of a 2048-token prefill chunk, one decode step
of a lone sequence at a 1k context) or, for CPU instances, from measurements; both are
corrected online from finished calls — decode by an exponentially weighted ratio of observed
to predicted times, prefill by the fit below — so a slow instance is seen as such within a
few calls. With an output-length distribution the time is a distribution too (the map is
monotone in the length).

A batching engine decodes slower the more sequences share a step (the step reads every
sequence's KV cache; a mixture-of-experts model touches more experts). So the model also
learns, from the same finished calls, how the observed decode ratio grows with the number of
calls running beside it (``co_runner_slope``): a weighted least-squares line over the last
``batch_window`` or so calls — measured, so it holds for any engine, model or GPU, and is 0
where nothing ever ran side by side (a CPU instance) or the data show no trend.

The prefill side follows the same principle: an instance is slow only if it is slow alone.
Time-to-first-token on a busy engine also holds the prompts admitted before the call and
not yet prefilled (their chunks share its steps) and its co-runners' decode tokens in those
steps. Folding that into the prefill rate made a busy fast GPU look like a slow one in every
term dispatch derives from it — its own time, the prompts ahead, the stall it inflicts —
counting contention twice (the dispatch prices the wait explicitly) and remembering it after
the load had gone. So the prefill ratio is the intrinsic one: the first coefficient of a
weighted least-squares fit of TTFT against (own uncached prompt, prompt tokens pending on
the instance when the call was admitted, co-runners then), each priced at the model's base
rates; the contention coefficients are kept >= 0 and the fit is over the last
``prefill_window`` or so calls. Each call is weighted by the inverse of the prefill work it
could have waited for, so with no contention the ratio is total observed over total priced
prefill — a short prompt whose first token waited for one shared step cannot swing it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from agentflow.hardware import (
    GPUProfile,
    ModelProfile,
    calibrated,
    default_max_num_batched_tokens,
)
from agentflow.hardware import gpu as gpu_profile
from agentflow.hardware import model as model_profile
from agentflow.scheduler.cluster import InstanceSpec

# Measured for the embedded default (gemma-3-270m Q4_K_M, llama.cpp, 2 threads): ~1.7 s for
# a 935-token prompt, ~37 output tokens/s. Corrected online like every other instance.
CPU_PREFILL_S_PER_TOKEN = 0.0019
PRIOR_CHUNK = 2048  # tokens of the prefill step a GPU prior is read at
# The clean decode ratio reads a call only if this many of its decode steps (and this share)
# carried no other prompt's chunk: the rest of its time is the stall, not its decode speed.
CLEAN_MIN_STEPS = 4
CLEAN_MIN_SHARE = 0.25
PRIOR_CONTEXT = 1024  # context of the decode step it is read at
CPU_DECODE_S_PER_TOKEN = 0.027
RATIO_FLOOR, RATIO_CEILING = 0.05, 20.0  # bounds of a learned observed/priced ratio


@dataclass
class InstanceTimeModel:
    prefill_s_per_token: float
    decode_s_per_token: float
    overhead_s: float = 0.0
    smoothing: float = 0.2  # weight of a new observation in the decode ratio
    prefill_ratio: float = 1.0
    decode_ratio: float = 1.0
    observations: int = 0
    # tokens a prefill chunk carries per step on the engine (vLLM's per-step token budget;
    # ``hardware.default_max_num_batched_tokens`` for a GPU): how many of a call's decode
    # steps the prompts prefilled beside it took (``_net_of_prefill``)
    chunk_tokens: int = PRIOR_CHUNK
    batch_window: int = 100  # calls: the memory of the co-runner regression
    # decayed sums over (co-runners x, decode ratio y): weight, x, y, xx, xy
    _batch_sums: list[float] = field(default_factory=lambda: [0.0] * 5, repr=False)
    prefill_window: int = 20  # calls: the memory of the prefill fit
    # what contention added to TTFT in the fit: seconds per base-priced second of prompts
    # pending at admission, and per co-runner decode step
    prefill_ahead_coef: float = 0.0
    prefill_co_runner_coef: float = 0.0
    # decayed weighted sums of the prefill fit: X'WX (3 x 3), X'Wy (3), y'Wy
    _prefill_xx: list[list[float]] = field(default_factory=lambda: [[0.0] * 3 for _ in range(3)],
                                           repr=False)
    _prefill_xy: list[float] = field(default_factory=lambda: [0.0] * 3, repr=False)
    _prefill_yy: float = field(default=0.0, repr=False)
    # The decode ratio net of the prefill stalls a call sat through (``observe``'s
    # ``prefill_during_tokens``): the instance's decode speed beside its co-runners' decode
    # steps, without the chunks of other prompts prefilled while it decoded. Read for a call
    # the headroom gate shields from lower-band prefill (``scheduler.classes``); its
    # co-runner regression alike.
    clean_decode_ratio: float = 1.0
    _clean_batch_sums: list[float] = field(default_factory=lambda: [0.0] * 5, repr=False)
    # observed / expected time of the last finished calls, each priced by the model as it
    # stood when the call finished (call deadlines read how far healthy calls run over:
    # agentflow.scheduler.call_deadline)
    call_ratios: deque[float] = field(default_factory=lambda: deque(maxlen=64), repr=False)
    # False: the starting rates are a guess (no hardware profile, a backend the CPU
    # constants were not measured on; ``InstanceSpec.speed_known``). Then the decode ratios
    # are the plain mean of the calls seen until there are ``1 / smoothing`` of them, so
    # the first answer replaces the guess (the prefill fit has no prior term either way).
    speed_known: bool = True
    decode_observations: int = 0
    # (uncached prompt tokens, output tokens, observed seconds) of the last finished calls:
    # what backlog admission prices an instance of guessed speed by where its learned
    # ratios sit at their bounds (``scheduler.backlog.measured_speed_factors``)
    recent_calls: deque[tuple[int, int, float]] = field(
        default_factory=lambda: deque(maxlen=32), repr=False)

    @classmethod
    def from_profile(cls, gpu: GPUProfile, model: ModelProfile,
                     tensor_parallel: int = 1) -> InstanceTimeModel:
        from agentflow.step_time import OperatorModel, StepShape

        ops = OperatorModel(gpu, model, tensor_parallel)
        prefill = ops.step(StepShape.of([PRIOR_CHUNK], [0])) / PRIOR_CHUNK
        decode = ops.step(StepShape.of([1], [PRIOR_CONTEXT]))
        return cls(prefill_s_per_token=prefill, decode_s_per_token=decode,
                   overhead_s=gpu.request_overhead_s)

    @classmethod
    def for_spec(cls, spec: InstanceSpec) -> InstanceTimeModel:
        if spec.gpu is None:
            return cls(CPU_PREFILL_S_PER_TOKEN, CPU_DECODE_S_PER_TOKEN,
                       speed_known=spec.speed_known)
        model = model_profile(spec.model or "Llama-3.1-8B")
        if spec.weight_bits is not None or spec.kv_bits is not None:
            model = model.quantized(spec.weight_bits or model.weight_bits, spec.kv_bits)
        # Constants fitted to measured vLLM latencies where they exist (agentflow.hardware).
        gpu = calibrated(gpu_profile(spec.gpu), model)
        timed = cls.from_profile(gpu, model, spec.tensor_parallel)
        timed.chunk_tokens = spec.max_num_batched_tokens or default_max_num_batched_tokens(gpu)
        return timed

    def prefill_s(self, prompt_tokens: float) -> float:
        return self.overhead_s + self.prompt_s(prompt_tokens)

    def prompt_s(self, tokens: float) -> float:
        """Prefill seconds of ``tokens`` prompt tokens at the learned rate, without the
        per-request overhead: what they cost the steps they share with other requests."""
        return tokens * self.prefill_s_per_token * self.prefill_ratio

    def decode_s(self, output_tokens: float) -> float:
        return output_tokens * self.decode_s_per_token * self.decode_ratio

    def expected_s(self, prompt_tokens: float, output_tokens: float) -> float:
        return self.prefill_s(prompt_tokens) + self.decode_s(output_tokens)

    def observe(self, prompt_tokens: int, output_tokens: int, ttft_s: float, total_s: float,
                cached_tokens: int = 0, co_runners: float | None = None,
                prefill_ahead_tokens: float = 0.0, co_runners_at_start: float = 0.0,
                prefill_during_tokens: float | None = None) -> None:
        """Fold in one finished call: time-to-first-token against prefill, the rest against
        decode; ``co_runners``: how many calls ran beside it on average (feeds
        ``co_runner_slope``); ``prefill_ahead_tokens`` and ``co_runners_at_start``: the
        prompt tokens admitted on the instance and not yet prefilled, and the calls running
        there, when this call was admitted (the contention its TTFT is fitted against);
        ``prefill_during_tokens``: prompt tokens of other calls prefilled on the instance
        while this one decoded (None: unknown, the clean ratio follows the plain one)."""
        a = self.smoothing
        if not self.speed_known:  # a guess, not a prior: the running mean at first
            a = max(a, 1.0 / (self.decode_observations + 1))
        uncached = max(0, prompt_tokens - cached_tokens)
        priced = self.expected_s(uncached, output_tokens)
        if priced > 1e-9 and total_s > 0:
            self.call_ratios.append(total_s / priced)
        if total_s > 0:
            self.recent_calls.append((uncached, output_tokens, total_s))
        predicted_prefill = uncached * self.prefill_s_per_token
        if predicted_prefill > 1e-6 and ttft_s > 0:
            self._fit_prefill(max(ttft_s - self.overhead_s, 1e-6), predicted_prefill,
                              max(prefill_ahead_tokens, 0.0) * self.prefill_s_per_token,
                              max(co_runners_at_start, 0.0) * self.decode_s_per_token)
        if output_tokens > 1 and total_s > ttft_s:
            ratio = (total_s - ttft_s) / ((output_tokens - 1) * self.decode_s_per_token)
            ratio = min(max(ratio, RATIO_FLOOR), RATIO_CEILING)
            self.decode_ratio = (1 - a) * self.decode_ratio + a * ratio
            self.decode_observations += 1
            clean: float | None = ratio
            if prefill_during_tokens is not None and math.isfinite(prefill_during_tokens):
                clean = self._net_of_prefill(total_s - ttft_s, output_tokens,
                                             prefill_during_tokens)
            if clean is not None:  # None: nearly every step carried a chunk; no reading
                self.clean_decode_ratio = (1 - a) * self.clean_decode_ratio + a * clean
            if co_runners is not None:
                self._add_batch(self._batch_sums, co_runners, ratio)
                if clean is not None:
                    self._add_batch(self._clean_batch_sums, co_runners, clean)
        self.observations += 1

    def _net_of_prefill(self, decode_s: float, output_tokens: int, during: float
                        ) -> float | None:
        """The decode ratio of ``decode_s`` over the steps that carried no chunk of another
        prompt (None: too few such steps to say). A step that carries a chunk is
        compute-bound: it costs about the chunk's prefill time, and the decode of every
        sequence in it runs inside that time. So ``during`` tokens, in chunks of the
        engine's token budget (``chunk_tokens``), take about their own prefill seconds (at
        the learned rate) out of ``decode_s`` *and* their steps out of the step count;
        dividing what is left by all the steps would count the mixed steps' decode twice
        and, under a flood where nearly every step is mixed, drive the ratio to its floor."""
        during = max(during, 0.0)
        steps = output_tokens - 1
        pure = steps - min(steps, math.ceil(during / self.chunk_tokens))
        if pure < max(CLEAN_MIN_STEPS, CLEAN_MIN_SHARE * steps):
            return None
        stall = self.prompt_s(during)
        ratio = (decode_s - stall) / (pure * self.decode_s_per_token)
        return min(max(ratio, RATIO_FLOOR), RATIO_CEILING)

    def _add_batch(self, sums: list[float], x: float, y: float) -> None:
        keep = 1.0 - 1.0 / self.batch_window
        for i, v in enumerate((1.0, x, y, x * x, x * y)):
            sums[i] = keep * sums[i] + v

    def _fit_prefill(self, y: float, own: float, ahead: float, co_runners: float) -> None:
        """One TTFT (less overhead) ``y`` against its base-priced own prefill, pending
        prompts and co-runner steps; refits ``prefill_ratio`` and the contention terms."""
        isfinite = math.isfinite
        if not (isfinite(y) and isfinite(own) and isfinite(ahead) and isfinite(co_runners)):
            return  # one inf would never decay out of the sums, one NaN would poison them
        total = own + ahead + co_runners
        # as the per-call ratio always was: no single call says the instance is more than
        # 20x slower (or faster) than its whole priced TTFT, however odd its timing
        y = min(max(y, RATIO_FLOOR * total), RATIO_CEILING * total)
        keep = 1.0 - 1.0 / self.prefill_window
        x0, x1, x2 = own, ahead, co_runners
        w = 1.0 / total
        xx, xy = self._prefill_xx, self._prefill_xy
        # the sums' update, ``xy[i] = keep * xy[i] + w * y * x[i]`` and ``xx[i][j] = keep *
        # xx[i][j] + w * x[i] * x[j]`` for i, j in 0..2, written out term for term (the
        # same operations in the same order, so the same floats, without the two loops:
        # this runs at every finished call)
        wy = w * y
        xy[0] = keep * xy[0] + wy * x0
        r = xx[0]
        wx = w * x0
        r[0], r[1], r[2] = keep * r[0] + wx * x0, keep * r[1] + wx * x1, keep * r[2] + wx * x2
        xy[1] = keep * xy[1] + wy * x1
        r = xx[1]
        wx = w * x1
        r[0], r[1], r[2] = keep * r[0] + wx * x0, keep * r[1] + wx * x1, keep * r[2] + wx * x2
        xy[2] = keep * xy[2] + wy * x2
        r = xx[2]
        wx = w * x2
        r[0], r[1], r[2] = keep * r[0] + wx * x0, keep * r[1] + wx * x1, keep * r[2] + wx * x2
        self._prefill_yy = keep * self._prefill_yy + w * y * y
        best = _bounded_least_squares(xx, xy, self._prefill_yy)
        if best is None:
            return
        self.prefill_ratio = min(max(best[0], RATIO_FLOOR), RATIO_CEILING)
        self.prefill_ahead_coef, self.prefill_co_runner_coef = best[1], best[2]

    def co_runner_slope(self, clean: bool = False) -> tuple[float, float]:
        """(slope, mean co-runners): how much the decode ratio rises per call running
        beside this one (>= 0), and the mean number of co-runners it was learned at (the
        load ``decode_ratio`` already reflects); ``clean``: of ``clean_decode_ratio``."""
        w, x, y, xx, xy = self._clean_batch_sums if clean else self._batch_sums
        if w <= 0:
            return 0.0, 0.0
        mean_x = x / w
        var = xx / w - mean_x * mean_x
        if var <= 1e-9:
            return 0.0, mean_x
        slope = (xy / w - mean_x * y / w) / var
        return max(0.0, slope), mean_x


def _bounded_least_squares(xx: list[list[float]], xy: list[float],
                           yy: float) -> list[float] | None:
    """Weighted least squares ``min |y - X b|`` from its sums (X'WX, X'Wy, y'Wy) with
    ``b[0] >= RATIO_FLOOR`` (the instance's own speed) and ``b[1], b[2] >= 0`` (contention
    only adds time): the problem is convex, so its optimum is the unconstrained optimum on
    one face of the box; each face is tried (each bound active or not, 8 at most) and the
    feasible one of least loss kept. None while no face is determined (nothing varied).

    It runs at every finished call, so the eight faces are written out as scalar
    arithmetic: the faces in the same order, each solved by Cramer's rule, with every sum
    written term for term as the general form (kept in the tests) adds them (a fixed
    coefficient's term included, zero or not), so the same floats come out, without the
    lists and generators that made it ~85 microseconds."""
    (a00, a01, a02), (a10, a11, a12), (a20, a21, a22) = xx
    y0, y1, y2 = xy
    f = RATIO_FLOOR
    best_loss = 0.0
    best: list[float] | None = None
    for face in range(8):
        if face == 0:  # own speed free, no contention
            if not a00 > 0:
                continue
            b0, b1, b2 = (y0 - ((0 + a01 * 0.0) + a02 * 0.0)) / a00, 0.0, 0.0
        elif face == 1:  # own and pending prompts free
            sol = _solve2(a00, a01, a10, a11, y0 - (0 + a02 * 0.0), y1 - (0 + a12 * 0.0))
            if sol is None:
                continue
            b0, b1, b2 = sol[0], sol[1], 0.0
        elif face == 2:  # own and co-runners free
            sol = _solve2(a00, a02, a20, a22, y0 - (0 + a01 * 0.0), y2 - (0 + a21 * 0.0))
            if sol is None:
                continue
            b0, b1, b2 = sol[0], 0.0, sol[1]
        elif face == 3:  # all free
            sol3 = _solve3(a00, a01, a02, a10, a11, a12, a20, a21, a22, y0 - 0, y1 - 0,
                           y2 - 0)
            if sol3 is None:
                continue
            b0, b1, b2 = sol3
        elif face == 4:  # own speed at its floor, no contention
            b0, b1, b2 = f, 0.0, 0.0
        elif face == 5:
            if not a11 > 0:
                continue
            b0, b1, b2 = f, (y1 - ((0 + a10 * f) + a12 * 0.0)) / a11, 0.0
        elif face == 6:
            if not a22 > 0:
                continue
            b0, b1, b2 = f, 0.0, (y2 - ((0 + a20 * f) + a21 * 0.0)) / a22
        else:
            sol = _solve2(a11, a12, a21, a22, y1 - (0 + a10 * f), y2 - (0 + a20 * f))
            if sol is None:
                continue
            b0, b1, b2 = f, sol[0], sol[1]
        if b0 < RATIO_FLOOR - 1e-12 or b1 < 0 or b2 < 0:
            continue  # off the feasible box: another face holds the optimum
        loss = yy - 2 * (((0 + b0 * y0) + b1 * y1) + b2 * y2) + (((((((((
            0 + b0 * b0 * a00) + b0 * b1 * a01) + b0 * b2 * a02) + b1 * b0 * a10)
            + b1 * b1 * a11) + b1 * b2 * a12) + b2 * b0 * a20) + b2 * b1 * a21)
            + b2 * b2 * a22)
        if best is None or loss < best_loss - 1e-12 * abs(yy):
            best_loss, best = loss, [b0, b1, b2]
    return best


def _solve2(a00: float, a01: float, a10: float, a11: float, r0: float, r1: float
            ) -> tuple[float, float] | None:
    """``a x = r`` for a symmetric positive semi-definite 2 x 2 system by Cramer's rule;
    None when ``a`` is singular to working precision."""
    det = a00 * a11 - a01 * a10
    scale = 1.0 * a00 * a11
    if scale <= 0 or det <= 1e-9 * scale:
        return None
    return (r0 * a11 - a01 * r1) / det, (a00 * r1 - r0 * a10) / det


def _solve3(a00: float, a01: float, a02: float, a10: float, a11: float, a12: float,
            a20: float, a21: float, a22: float, r0: float, r1: float, r2: float
            ) -> tuple[float, float, float] | None:
    """The 3 x 3 system as ``_solve2`` (each unknown: the determinant with its column
    replaced by ``r``, over the determinant)."""
    det = _det3(a00, a01, a02, a10, a11, a12, a20, a21, a22)
    scale = 1.0 * a00 * a11 * a22
    if scale <= 0 or det <= 1e-9 * scale:
        return None
    return (_det3(r0, a01, a02, r1, a11, a12, r2, a21, a22) / det,
            _det3(a00, r0, a02, a10, r1, a12, a20, r2, a22) / det,
            _det3(a00, a01, r0, a10, a11, r1, a20, a21, r2) / det)


def _det3(m00: float, m01: float, m02: float, m10: float, m11: float, m12: float,
          m20: float, m21: float, m22: float) -> float:
    return (m00 * (m11 * m22 - m12 * m21)
            - m01 * (m10 * m22 - m12 * m20)
            + m02 * (m10 * m21 - m11 * m20))
