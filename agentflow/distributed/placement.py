"""``placement: ray`` — where a config's instances run, and what each one asks Ray for.

Why resources and not host names: a heterogeneous cluster is described by what its nodes
*have* (GPUs of some type), so an instance entry says what it *needs* — ``num_gpus`` = its
tensor-parallel size and Ray's ``accelerator_type:<GPU>`` marker for its ``gpu`` — and Ray
puts "2x A100 + 1x L40S" on the nodes that have them. Ray-free: this module only validates
and computes; ``ray_backend`` does the placing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# agentflow GPU profile names (agentflow.hardware) -> the accelerator type Ray detects on a
# node with that GPU (Ray takes the model token of the NVML name: "NVIDIA A100-SXM4-80GB" ->
# "A100", "NVIDIA RTX A6000" -> "RTX-A6000"). Names not listed are passed as they are.
RAY_ACCELERATOR_TYPES: dict[str, str] = {
    "A100-80G": "A100",
    "A100-40G": "A100",
    "A6000": "RTX-A6000",
}

# Ray registers ``accelerator_type:<T>: 1`` per node whatever its GPU count, so an actor asks
# for a sliver of it (Ray's own ``accelerator_type=`` option does the same); the GPU count
# is what ``num_gpus`` reserves.
ACCELERATOR_SLIVER = 0.001


class RayPlacement(BaseModel):
    """Run every instance of the config as a Ray actor.

    ``address``: ``auto`` (the cluster ``ray start`` made on this machine, or ``RAY_ADDRESS``),
    ``local`` (start a private single-node Ray in this process), ``HOST:6379`` or
    ``ray://HOST:10001`` (Ray Client). ``max_restarts``: how often Ray restarts a dead actor
    (-1: always); the instance is down until the restarted actor answers a probe.
    """

    model_config = ConfigDict(extra="forbid")

    type: Literal["ray"] = "ray"
    address: str = "auto"
    namespace: str = "agentflow"
    max_restarts: int = Field(3, ge=-1)
    startup_timeout_s: float = Field(900.0, gt=0)  # vLLM loads of 70B models take minutes
    probe_timeout_s: float = Field(10.0, gt=0)
    # Overrides of RAY_ACCELERATOR_TYPES, e.g. {"A100-80G": "A100-SXM4-80GB"} for nodes
    # started with a custom resource name.
    accelerator_types: dict[str, str] = Field(default_factory=dict)
    # CPUs reserved per GPU instance (Ray's own default for a running actor is 0).
    cpus_per_gpu_instance: float = Field(0.0, ge=0)
    # Passed to ray.init: e.g. {"pip": [...]} or {"working_dir": "."} when agentflow is not
    # installed on the workers.
    runtime_env: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):  # ``placement: ray``
            if value != "ray":
                raise ValueError(f"unknown placement {value!r}; the only one is 'ray'")
            return {"type": "ray"}
        return value

    def accelerator_type(self, gpu: str) -> str:
        return self.accelerator_types.get(gpu) or RAY_ACCELERATOR_TYPES.get(gpu, gpu)


class ActorResources(BaseModel):
    """What one instance's actor asks Ray for."""

    model_config = ConfigDict(extra="forbid")

    num_cpus: float
    num_gpus: float
    resources: dict[str, float]

    def describe(self) -> str:
        parts = [f"{self.num_gpus:g} GPU" if self.num_gpus else "",
                 f"{self.num_cpus:g} CPU" if self.num_cpus else "",
                 *[f"{k}" for k in self.resources]]
        return ", ".join(p for p in parts if p) or "nothing"


def tensor_parallel(instance: Any) -> int:
    """The instance's tensor-parallel size: its ``tensor_parallel`` field (the one the
    scheduler's time model reads too), else vLLM's ``tensor_parallel_size`` engine arg, else
    1."""
    value = getattr(instance, "tensor_parallel", None)
    if value:
        return int(value)
    backend = getattr(instance, "backend", None) or {}
    engine_args = backend.get("engine_args") or {}
    return int(engine_args.get("tensor_parallel_size") or 1)


def actor_resources(instance: Any, placement: RayPlacement) -> ActorResources:
    """GPU instances: ``num_gpus`` = tensor-parallel size plus the GPU type's marker. CPU
    instances: a llama.cpp model reserves its threads; scripted/HTTP-client backends reserve
    nothing (they wait, they do not compute)."""
    backend = instance.backend or {}
    kind = backend.get("type", "local")
    if instance.gpu is not None:
        tp = tensor_parallel(instance)
        if tp < 1:
            raise ValueError(f"instance {instance.name}: tensor-parallel size must be >= 1")
        args_tp = (backend.get("engine_args") or {}).get("tensor_parallel_size")
        if kind == "vllm" and args_tp is not None and int(args_tp) != tp:
            raise ValueError(f"instance {instance.name}: tensor_parallel is {tp} but "
                             f"engine_args.tensor_parallel_size is {args_tp}; set "
                             f"tensor_parallel: {args_tp} (the scheduler and the placement "
                             f"both read it)")
        marker = f"accelerator_type:{placement.accelerator_type(instance.gpu)}"
        return ActorResources(num_cpus=placement.cpus_per_gpu_instance, num_gpus=tp,
                              resources={marker: ACCELERATOR_SLIVER})
    if kind == "vllm":
        raise ValueError(f"instance {instance.name}: a vllm backend needs a 'gpu' (the GPU "
                         f"type it runs on) to be placed on a GPU node")
    cpus = float(backend.get("n_threads") or 1) if kind == "local" else 0.0
    return ActorResources(num_cpus=cpus, num_gpus=0, resources={})


def actor_backend_spec(instance: Any) -> dict[str, Any]:
    """The backend spec the actor builds. A vLLM engine gets the instance's tensor-parallel
    size, and, when it spans several GPUs, multiprocessing workers inside the actor
    (``distributed_executor_backend: mp``): vLLM's Ray executor would ask Ray for the GPUs
    this actor already holds and wait forever. Untested here (no GPUs); explicit engine
    args win."""
    spec = dict(instance.backend or {})
    if spec.get("type") == "vllm":
        args = dict(spec.get("engine_args") or {})
        tp = tensor_parallel(instance)
        args.setdefault("tensor_parallel_size", tp)
        if tp > 1:
            args.setdefault("distributed_executor_backend", "mp")
        spec["engine_args"] = args
    return spec


def fits(need: ActorResources, node_resources: dict[str, float]) -> bool:
    """Whether a node with these *total* resources could ever host the actor."""
    if need.num_cpus and node_resources.get("CPU", 0.0) < need.num_cpus:
        return False
    if need.num_gpus and node_resources.get("GPU", 0.0) < need.num_gpus:
        return False
    return all(node_resources.get(k, 0.0) >= v for k, v in need.resources.items())
