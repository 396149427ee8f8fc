"""Backends from plain config dicts (cluster files, CLI flags), validated before anything loads.

Why pydantic models per type: a typo in a cluster file should fail at start-up with the field
name, not minutes later inside a model load or an HTTP call. Secrets never sit in the spec:
the OpenAI spec names the environment variable that holds the key.
"""

from __future__ import annotations

import os
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentflow.llm.base import LLMBackend
from agentflow.llm.llamacpp_server import LlamaServerSpec as _LlamaServerFields


class BackendSpecError(ValueError):
    """A backend spec is malformed (unknown type, missing or bad field, missing env var)."""


class BackendSpec(BaseModel):
    """One backend type's config fields; the subclass builds its backend from them.

    Adding a backend type is two edits: a subclass with a ``type: Literal["name"]`` field and a
    ``build`` method, and its entry in ``SPECS``. Imports of heavy libraries stay inside
    ``build`` so validating a cluster file never loads a model runtime.
    """

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    type: str
    name: str

    def build(self) -> LLMBackend:
        raise NotImplementedError(f"{type(self).__name__} does not build a backend")


class LocalSpec(BackendSpec):
    type: Literal["local"]
    name: str = "local"
    model_path: str | None = None  # None: the embedded 270M Gemma 3 GGUF
    n_ctx: int = Field(4096, gt=0)
    n_threads: int | None = Field(None, gt=0)
    n_threads_batch: int | None = Field(None, gt=0)
    n_batch: int = Field(512, gt=0)
    prefix_cache_bytes: int | None = Field(None, ge=0)  # None: the backend's default
    use_extra_bufts: bool = False

    def build(self) -> LLMBackend:
        from agentflow.llm.local import DEFAULT_PREFIX_CACHE_BYTES, LocalLlamaBackend
        return LocalLlamaBackend(
            self.model_path, n_ctx=self.n_ctx, n_threads=self.n_threads,
            n_threads_batch=self.n_threads_batch, n_batch=self.n_batch,
            prefix_cache_bytes=(DEFAULT_PREFIX_CACHE_BYTES if self.prefix_cache_bytes is None
                                else self.prefix_cache_bytes),
            use_extra_bufts=self.use_extra_bufts, name=self.name)


class OpenAISpec(BackendSpec):
    type: Literal["openai"]
    name: str = "openai"
    base_url: str
    model: str
    api_key_env: str | None = None  # e.g. "OPENAI_API_KEY"; None for keyless local servers
    chat: bool = False
    vllm_priority: bool = False
    timeout_s: float = Field(300.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    max_retries: int = Field(0, ge=0)
    stream_usage: bool = True
    grammar_param: str | None = "grammar"
    extra_body: dict[str, Any] = Field(default_factory=dict)
    send_request_id: bool = False

    def build(self) -> LLMBackend:
        from agentflow.llm.openai_compat import OpenAIBackend
        api_key = None
        if self.api_key_env:
            api_key = os.environ.get(self.api_key_env)
            if not api_key:
                raise BackendSpecError(f"backend {self.name!r}: environment variable "
                                       f"{self.api_key_env} is not set")
        return OpenAIBackend(
            self.base_url, self.model, api_key=api_key, chat=self.chat,
            vllm_priority=self.vllm_priority, timeout_s=self.timeout_s,
            connect_timeout_s=self.connect_timeout_s, max_retries=self.max_retries,
            stream_usage=self.stream_usage, grammar_param=self.grammar_param,
            extra_body=self.extra_body, send_request_id=self.send_request_id,
            name=self.name)


class VLLMSpec(BackendSpec):
    type: Literal["vllm"]
    name: str = "vllm"
    model: str
    engine_args: dict[str, Any] = Field(default_factory=dict)

    def build(self) -> LLMBackend:
        from agentflow.llm.vllm_engine import VLLMEngineBackend
        return VLLMEngineBackend(model=self.model, engine_args=self.engine_args, name=self.name)


class ScriptedFaultSpec(BaseModel):
    """See ``agentflow.llm.scripted.Fault``."""

    model_config = ConfigDict(extra="forbid")
    after_calls: int = Field(0, ge=0)
    from_s: float | None = Field(None, ge=0)
    until_s: float | None = Field(None, ge=0)
    fail: bool = False
    retryable: bool = True
    latency_s: float | None = Field(None, ge=0)
    slowdown: float = Field(1.0, gt=0)
    stall_after_tokens: int | None = Field(None, ge=0)


class ScriptedSpec(BackendSpec):
    type: Literal["scripted"]
    name: str = "scripted"
    answers: dict[str, str | list[str]] = Field(default_factory=dict)
    default: str | None = None
    # a call whose prompt contains the key gets its answer, before ``answers`` (a benchmark
    # gives one tenant's questions slow SQL)
    by_prompt: dict[str, str] = Field(default_factory=dict)
    latency_s: float = Field(0.0, ge=0)
    per_token_s: float = Field(0.0, ge=0)
    fail_after: int | None = Field(None, ge=0)
    fail_retryable: bool = True
    faults: list[ScriptedFaultSpec] = Field(default_factory=list)
    # every call waits until this file exists (a test's gate on a server in another process)
    hold_until_file: str | None = None

    def build(self) -> LLMBackend:
        from agentflow.llm.scripted import Fault, Hold, ScriptedBackend
        hold = Hold(release_file=self.hold_until_file) if self.hold_until_file else None
        return ScriptedBackend(self.answers, default=self.default, latency_s=self.latency_s,
                               per_token_s=self.per_token_s, fail_after=self.fail_after,
                               fail_retryable=self.fail_retryable, name=self.name,
                               faults=[Fault(**f.model_dump()) for f in self.faults],
                               hold=hold, by_prompt=self.by_prompt)


class LlamaServerSpec(_LlamaServerFields, BackendSpec):
    """llama.cpp's llama-server, started by agentflow (``agentflow.llm.llamacpp_server``)."""

    def build(self) -> LLMBackend:
        from agentflow.llm.llamacpp_server import LlamaServerBackend
        return LlamaServerBackend(self)


# The one list of backend types: KNOWN_TYPES and the type -> spec lookup derive from it.
SPECS: tuple[type[BackendSpec], ...] = (LocalSpec, OpenAISpec, VLLMSpec, ScriptedSpec,
                                        LlamaServerSpec)


def _type_name(spec_cls: type[BackendSpec]) -> str:
    (name,) = get_args(spec_cls.model_fields["type"].annotation)
    return str(name)


_BY_TYPE: dict[str, type[BackendSpec]] = {_type_name(cls): cls for cls in SPECS}
KNOWN_TYPES: tuple[str, ...] = tuple(_BY_TYPE)


def parse_backend_spec(spec: dict[str, Any] | BaseModel) -> BackendSpec:
    """Validate ``spec``; raises ``BackendSpecError`` naming the offending fields."""
    if isinstance(spec, BackendSpec):
        return spec
    if not isinstance(spec, dict):
        raise BackendSpecError(f"a backend spec must be a mapping, got {type(spec).__name__}")
    kind = spec.get("type")
    if kind is None:
        raise BackendSpecError(f"backend spec has no 'type' (one of {', '.join(KNOWN_TYPES)})")
    spec_cls = _BY_TYPE.get(kind) if isinstance(kind, str) else None
    if spec_cls is None:
        raise BackendSpecError(
            f"unknown backend type {kind!r} (known: {', '.join(KNOWN_TYPES)})")
    try:
        return spec_cls.model_validate(spec)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}"
            for err in exc.errors())
        raise BackendSpecError(f"invalid {kind!r} backend spec: {problems}") from None


def create_backend(spec: dict[str, Any] | BaseModel) -> LLMBackend:
    """Build the backend a spec describes, e.g. ``{"type": "local", "n_threads": 2}``."""
    return parse_backend_spec(spec).build()
