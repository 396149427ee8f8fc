"""Expected time of an LLM call on an instance: ``t(s, i)`` in HexGen-Flow's rules.

A call's time is prefill (linear in uncached prompt tokens) plus decode (linear in output
tokens). Starting points come from the hardware profile, through the simulator's operator
step model (``agentflow.step_time``: per token of a 2048-token prefill chunk, one decode step
of a lone sequence at a 1k context) or, for CPU instances, from measurements; both are
corrected online by an exponentially weighted ratio of observed to predicted times, so a slow
or contended instance is seen as such within a few calls. With an output-length distribution
the time is a distribution too (the map is monotone in the length).

A batching engine decodes slower the more sequences share a step (the step reads every
sequence's KV cache; a mixture-of-experts model touches more experts). So the model also
learns, from the same finished calls, how the observed decode ratio grows with the number of
calls running beside it (``co_runner_slope``): a weighted least-squares line over the last
``batch_window`` or so calls — measured, so it holds for any engine, model or GPU, and is 0
where nothing ever ran side by side (a CPU instance) or the data show no trend.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from agentflow.hardware import GPUProfile, ModelProfile, calibrated
from agentflow.hardware import gpu as gpu_profile
from agentflow.hardware import model as model_profile
from agentflow.scheduler.cluster import InstanceSpec

# Measured for the embedded default (gemma-3-270m Q4_K_M, llama.cpp, 2 threads): ~1.7 s for
# a 935-token prompt, ~37 output tokens/s. Corrected online like every other instance.
CPU_PREFILL_S_PER_TOKEN = 0.0019
PRIOR_CHUNK = 2048  # tokens of the prefill step a GPU prior is read at
PRIOR_CONTEXT = 1024  # context of the decode step it is read at
CPU_DECODE_S_PER_TOKEN = 0.027


@dataclass
class InstanceTimeModel:
    prefill_s_per_token: float
    decode_s_per_token: float
    overhead_s: float = 0.0
    smoothing: float = 0.2  # weight of a new observation in the correction ratios
    prefill_ratio: float = 1.0
    decode_ratio: float = 1.0
    observations: int = 0
    batch_window: int = 100  # calls: the memory of the co-runner regression
    # decayed sums over (co-runners x, decode ratio y): weight, x, y, xx, xy
    _batch_sums: list[float] = field(default_factory=lambda: [0.0] * 5, repr=False)
    # observed / expected time of the last finished calls, each priced by the model as it
    # stood when the call finished (call deadlines read how far healthy calls run over:
    # agentflow.scheduler.call_deadline)
    call_ratios: deque[float] = field(default_factory=lambda: deque(maxlen=64), repr=False)

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
            return cls(CPU_PREFILL_S_PER_TOKEN, CPU_DECODE_S_PER_TOKEN)
        model = model_profile(spec.model or "Llama-3.1-8B")
        if spec.weight_bits is not None or spec.kv_bits is not None:
            model = model.quantized(spec.weight_bits or model.weight_bits, spec.kv_bits)
        # Constants fitted to measured vLLM latencies where they exist (agentflow.hardware).
        gpu = calibrated(gpu_profile(spec.gpu), model)
        return cls.from_profile(gpu, model, spec.tensor_parallel)

    def prefill_s(self, prompt_tokens: float) -> float:
        return self.overhead_s + prompt_tokens * self.prefill_s_per_token * self.prefill_ratio

    def decode_s(self, output_tokens: float) -> float:
        return output_tokens * self.decode_s_per_token * self.decode_ratio

    def expected_s(self, prompt_tokens: float, output_tokens: float) -> float:
        return self.prefill_s(prompt_tokens) + self.decode_s(output_tokens)

    def observe(self, prompt_tokens: int, output_tokens: int, ttft_s: float, total_s: float,
                cached_tokens: int = 0, co_runners: float | None = None) -> None:
        """Fold in one finished call: time-to-first-token against prefill, the rest against
        decode; ``co_runners``: how many calls ran beside it on average (feeds
        ``co_runner_slope``)."""
        a = self.smoothing
        uncached = max(0, prompt_tokens - cached_tokens)
        priced = self.expected_s(uncached, output_tokens)
        if priced > 1e-9 and total_s > 0:
            self.call_ratios.append(total_s / priced)
        predicted_prefill = uncached * self.prefill_s_per_token
        if predicted_prefill > 1e-6 and ttft_s > 0:
            ratio = max(ttft_s - self.overhead_s, 1e-6) / predicted_prefill
            self.prefill_ratio = (1 - a) * self.prefill_ratio + a * min(max(ratio, 0.05), 20)
        if output_tokens > 1 and total_s > ttft_s:
            ratio = (total_s - ttft_s) / ((output_tokens - 1) * self.decode_s_per_token)
            ratio = min(max(ratio, 0.05), 20)
            self.decode_ratio = (1 - a) * self.decode_ratio + a * ratio
            if co_runners is not None:
                keep = 1.0 - 1.0 / self.batch_window
                sums = self._batch_sums
                for i, v in enumerate((1.0, co_runners, ratio, co_runners * co_runners,
                                       co_runners * ratio)):
                    sums[i] = keep * sums[i] + v
        self.observations += 1

    def co_runner_slope(self) -> tuple[float, float]:
        """(slope, mean co-runners): how much the decode ratio rises per call running
        beside this one (>= 0), and the mean number of co-runners it was learned at (the
        load ``decode_ratio`` already reflects)."""
        w, x, y, xx, xy = self._batch_sums
        if w <= 0:
            return 0.0, 0.0
        mean_x = x / w
        var = xx / w - mean_x * mean_x
        if var <= 1e-9:
            return 0.0, mean_x
        slope = (xy / w - mean_x * y / w) / var
        return max(0.0, slope), mean_x
