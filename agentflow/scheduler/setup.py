"""Building the coordinator from configuration — one function for serving and simulation.

``build_coordinator`` turns instance descriptions (``agentflow.config.InstanceConfig``) and
scheduler settings into a ``Coordinator``: the same ``InstanceSpec``s, policy, alpha, length
model and admission limits whichever runtime drives it. ``AgentFlow`` calls it with a wall
clock, ``agentflow.sim.Simulation`` with a virtual one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentflow import hardware
from agentflow.scheduler.cluster import InstanceSpec
from agentflow.scheduler.coordinator import Coordinator
from agentflow.scheduler.fast_lane import FAST_LANE_CALLS
from agentflow.scheduler.lengths import LengthModel, make_length_model
from agentflow.scheduler.policies import parse_policy
from agentflow.slo_classes import SloClass
from agentflow.workflow.clock import Clock

if TYPE_CHECKING:
    from agentflow.config import InstanceConfig, SchedulerConfig


def build_coordinator(instances: Sequence[InstanceConfig], *, clock: Clock, policy: str,
                      alpha: float | None = None, embedder: str = "hashing",
                      length_model: LengthModel | None = None,
                      max_waiting_calls: int | None = None,
                      max_active_queries: int | None = None,
                      admit_by_backlog: bool = False,
                      max_backlog_s: float | None = None,
                      slo_classes: Mapping[str, SloClass] | None = None,
                      deadline_admission: str | None = None,
                      preemption: str | None = None,
                      fast_lane: int | None = FAST_LANE_CALLS) -> Coordinator:
    """``instances`` must be named (``expand_instances``); ``length_model`` defaults to the
    length model the policy name picks, with ``embedder``."""
    specs = [instance_spec(cfg) for cfg in instances]
    if length_model is None:
        length_model = make_length_model(parse_policy(policy).length_model, embedder=embedder)
    return Coordinator(specs, clock=clock, policy=policy, alpha=alpha, length_model=length_model,
                       max_waiting_calls=max_waiting_calls,
                       max_active_queries=max_active_queries,
                       admit_by_backlog=admit_by_backlog, max_backlog_s=max_backlog_s,
                       slo_classes=slo_classes, deadline_admission=deadline_admission,
                       preemption=preemption, fast_lane=fast_lane)


def scheduler_settings(scheduler: SchedulerConfig) -> dict[str, Any]:
    """``build_coordinator``'s keyword arguments from a config's scheduler section."""
    return {"policy": scheduler.policy, "alpha": scheduler.alpha,
            "embedder": scheduler.embedder, "max_waiting_calls": scheduler.max_waiting_calls,
            "max_active_queries": scheduler.max_active_queries,
            "admit_by_backlog": scheduler.admit_by_backlog,
            "max_backlog_s": scheduler.max_backlog_s,
            "slo_classes": dict(scheduler.slo_classes),
            "deadline_admission": scheduler.deadline_admission,
            "preemption": scheduler.preemption, "fast_lane": scheduler.fast_lane}


def instance_spec(cfg: InstanceConfig, name: str | None = None) -> InstanceSpec:
    """What the scheduler is told about a configured instance — in serving and in the
    simulator alike. Without an explicit ``kv_token_budget``, a GPU instance's budget is
    the KV cache a vLLM engine with its limits holds (``hardware.kv_cache_blocks``, the
    formula the simulator uses too)."""
    name = name or cfg.name
    if name is None:
        raise ValueError("an instance needs a name (expand the cluster's instances first)")
    kv = cfg.kv_token_budget
    if kv is None and cfg.gpu is not None and cfg.model is not None:
        kv = vllm_kv_tokens(cfg)
        if kv < 1:
            raise ValueError(f"instance {name}: {cfg.model} does not fit on "
                             f"{cfg.tensor_parallel} x {cfg.gpu} at utilization "
                             f"{cfg.gpu_memory_utilization}; set its tensor_parallel or "
                             "weight_bits as deployed, or its kv_token_budget")
    return InstanceSpec(name=name, gpu=cfg.gpu, model=cfg.model,
                        max_inflight=cfg.inflight_limit, kv_token_budget=kv,
                        tensor_parallel=cfg.tensor_parallel,
                        max_pending_prefill=cfg.max_pending_prefill,
                        weight_bits=cfg.weight_bits, kv_bits=cfg.kv_bits,
                        max_num_batched_tokens=cfg.max_num_batched_tokens,
                        backend=backend_type(cfg.backend), speed_known=speed_known(cfg))


# Backends whose speed the CPU constants of ``scheduler.time_model`` were measured on.
MEASURED_CPU_BACKENDS = frozenset({"local", "llama_server"})


def backend_type(backend: dict[str, object]) -> str | None:
    kind = backend.get("type")
    return kind if isinstance(kind, str) else None


def speed_known(cfg: InstanceConfig) -> bool:
    """Whether the scheduler's time model has a real starting point for ``cfg``: a GPU
    profile, or an embedded CPU engine (``MEASURED_CPU_BACKENDS``)."""
    return cfg.gpu is not None or backend_type(cfg.backend) in MEASURED_CPU_BACKENDS


BLOCK_SIZE = 16  # vLLM's default KV block size (tokens)


def vllm_kv_tokens(cfg: InstanceConfig) -> int:
    """KV-cache tokens a vLLM engine with ``cfg``'s GPU, model, precision and limits holds."""
    if cfg.gpu is None or cfg.model is None:
        raise ValueError("a KV budget from the hardware needs the instance's gpu and model")
    g = hardware.gpu(cfg.gpu)
    m = hardware.model(cfg.model)
    if (cfg.weight_bits, cfg.kv_bits) != (16, 16):
        m = m.quantized(cfg.weight_bits, cfg.kv_bits)
    tokens = cfg.max_num_batched_tokens or hardware.default_max_num_batched_tokens(g)
    blocks = hardware.kv_cache_blocks(g, m, cfg.tensor_parallel,
                                      max_num_seqs=cfg.max_num_seqs,
                                      max_num_batched_tokens=tokens, block_size=BLOCK_SIZE,
                                      gpu_memory_utilization=cfg.gpu_memory_utilization)
    return blocks * BLOCK_SIZE

