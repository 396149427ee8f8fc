"""A cluster is a set of model instances: what runs where and how much it may hold at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentflow import hardware

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
    # prompt tokens the engine prefills per step (vLLM's max_num_batched_tokens); None: the
    # GPU's vLLM default (``hardware.default_max_num_batched_tokens``)
    max_num_batched_tokens: int | None = None
    # The backend's type (``agentflow.llm.registry``), when known: instances of one GPU,
    # model and backend are peers, priced alike until each has answered (``peer_key``).
    backend: str | None = None
    # Whether the time model's starting point describes this instance: a hardware profile,
    # or the embedded CPU engines the CPU constants were measured on. False (no profile and
    # another backend: a scripted one, a remote endpoint): its speed is unknown until it
    # answers, so nothing is refused on the strength of that guess (``scheduler.backlog``)
    # and its first answers replace the guess instead of nudging it.
    speed_known: bool = True

    def __post_init__(self) -> None:
        if self.max_inflight < 1:
            raise ValueError(f"instance {self.name}: max_inflight must be >= 1")

    @property
    def peer_key(self) -> tuple[str | None, str | None, str | None]:
        """What makes two instances alike for pricing: GPU, model and backend type."""
        return self.gpu, self.model, self.backend

    @classmethod
    def from_config(cls, cfg: InstanceConfig, name: str | None = None) -> InstanceSpec:
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
        return cls(name=name, gpu=cfg.gpu, model=cfg.model, max_inflight=cfg.inflight_limit,
                   kv_token_budget=kv, tensor_parallel=cfg.tensor_parallel,
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
