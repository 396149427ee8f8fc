"""A cluster is a set of model instances: what runs where and how much it may hold at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentflow.config import InstanceConfig


@dataclass(frozen=True)
class InstanceSpec:
    """One model instance as the scheduler sees it.

    ``gpu``/``model`` name profiles in ``agentflow.hardware`` (``gpu=None`` is a CPU instance
    timed by measurement). ``max_inflight`` caps calls admitted at once; ``kv_token_budget``
    caps the KV-cache tokens (prompt + predicted output) of admitted calls.
    """

    name: str
    gpu: str | None = None
    model: str | None = None
    max_inflight: int = 1
    kv_token_budget: int | None = None
    tensor_parallel: int = 1
    # Admitted calls still waiting for their first token (queued or prefilling inside the
    # engine). Bounding them keeps the waiting in the coordinator's queue, where the queue
    # policy orders it, instead of in the engine's own queue. None: no bound.
    max_pending_prefill: int | None = None
    weight_bits: int | None = None  # None: the model profile's own precision
    kv_bits: int | None = None

    def __post_init__(self) -> None:
        if self.max_inflight < 1:
            raise ValueError(f"instance {self.name}: max_inflight must be >= 1")

    @classmethod
    def from_config(cls, cfg: InstanceConfig, name: str | None = None) -> InstanceSpec:
        """What the scheduler is told about a configured instance — in serving and in the
        simulator alike. Without an explicit ``kv_token_budget``, a GPU instance's budget is
        the KV cache a vLLM engine with its limits holds (the simulator's capacity model)."""
        name = name or cfg.name
        if name is None:
            raise ValueError("an instance needs a name (expand the cluster's instances first)")
        kv = cfg.kv_token_budget
        if kv is None and cfg.gpu is not None and cfg.model is not None:
            from agentflow.sim.engine import engine_for

            try:
                engine = engine_for(name, cfg)
            except ValueError as err:
                raise ValueError(f"instance {name}: {err}; set its tensor_parallel or "
                                 "weight_bits as deployed, or its kv_token_budget") from None
            kv = engine.kv_blocks_total * engine.block_size
        return cls(name=name, gpu=cfg.gpu, model=cfg.model, max_inflight=cfg.inflight_limit,
                   kv_token_budget=kv, tensor_parallel=cfg.tensor_parallel,
                   max_pending_prefill=cfg.max_pending_prefill,
                   weight_bits=cfg.weight_bits, kv_bits=cfg.kv_bits)
