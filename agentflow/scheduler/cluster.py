"""A cluster is a set of model instances: what runs where and how much it may hold at once."""

from __future__ import annotations

from dataclasses import dataclass


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
