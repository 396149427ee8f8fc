"""Backends from plain config dicts (cluster files, CLI flags), validated before anything loads.

Why pydantic models per type: a typo in a cluster file should fail at start-up with the field
name, not minutes later inside a model load or an HTTP call. Secrets never sit in the spec:
the OpenAI spec names the environment variable that holds the key.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from agentflow.llm.base import LLMBackend
from agentflow.llm.llamacpp_server import LlamaServerSpec


class BackendSpecError(ValueError):
    """A backend spec is malformed (unknown type, missing or bad field, missing env var)."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class LocalSpec(_Spec):
    type: Literal["local"]
    name: str = "local"
    model_path: str | None = None  # None: the embedded 270M Gemma 3 GGUF
    n_ctx: int = Field(4096, gt=0)
    n_threads: int | None = Field(None, gt=0)
    n_threads_batch: int | None = Field(None, gt=0)
    n_batch: int = Field(512, gt=0)
    prefix_cache_bytes: int | None = Field(None, ge=0)  # None: the backend's default
    use_extra_bufts: bool = False


class OpenAISpec(_Spec):
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


class VLLMSpec(_Spec):
    type: Literal["vllm"]
    name: str = "vllm"
    model: str
    engine_args: dict[str, Any] = Field(default_factory=dict)


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


class ScriptedSpec(_Spec):
    type: Literal["scripted"]
    name: str = "scripted"
    answers: dict[str, str | list[str]] = Field(default_factory=dict)
    default: str | None = None
    latency_s: float = Field(0.0, ge=0)
    per_token_s: float = Field(0.0, ge=0)
    fail_after: int | None = Field(None, ge=0)
    fail_retryable: bool = True
    faults: list[ScriptedFaultSpec] = Field(default_factory=list)


AnySpec = LocalSpec | OpenAISpec | VLLMSpec | ScriptedSpec | LlamaServerSpec
BackendSpec = Annotated[AnySpec, Field(discriminator="type")]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(BackendSpec)
KNOWN_TYPES = ("local", "openai", "vllm", "scripted", "llama_server")


def parse_backend_spec(spec: dict[str, Any] | BaseModel) -> AnySpec:
    """Validate ``spec``; raises ``BackendSpecError`` naming the offending fields."""
    if isinstance(spec, (LocalSpec, OpenAISpec, VLLMSpec, ScriptedSpec, LlamaServerSpec)):
        return spec
    if not isinstance(spec, dict):
        raise BackendSpecError(f"a backend spec must be a mapping, got {type(spec).__name__}")
    kind = spec.get("type")
    if kind is None:
        raise BackendSpecError(f"backend spec has no 'type' (one of {', '.join(KNOWN_TYPES)})")
    if kind not in KNOWN_TYPES:
        raise BackendSpecError(
            f"unknown backend type {kind!r} (known: {', '.join(KNOWN_TYPES)})")
    try:
        return _ADAPTER.validate_python(spec)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or 'spec'}: {err['msg']}"
            for err in exc.errors())
        raise BackendSpecError(f"invalid {kind!r} backend spec: {problems}") from None


def create_backend(spec: dict[str, Any] | BaseModel) -> LLMBackend:
    """Build the backend a spec describes, e.g. ``{"type": "local", "n_threads": 2}``."""
    parsed = parse_backend_spec(spec)
    if isinstance(parsed, LocalSpec):
        from agentflow.llm.local import DEFAULT_PREFIX_CACHE_BYTES, LocalLlamaBackend
        return LocalLlamaBackend(
            parsed.model_path, n_ctx=parsed.n_ctx, n_threads=parsed.n_threads,
            n_threads_batch=parsed.n_threads_batch, n_batch=parsed.n_batch,
            prefix_cache_bytes=(DEFAULT_PREFIX_CACHE_BYTES if parsed.prefix_cache_bytes is None
                                else parsed.prefix_cache_bytes),
            use_extra_bufts=parsed.use_extra_bufts, name=parsed.name)
    if isinstance(parsed, OpenAISpec):
        from agentflow.llm.openai_compat import OpenAIBackend
        api_key = None
        if parsed.api_key_env:
            api_key = os.environ.get(parsed.api_key_env)
            if not api_key:
                raise BackendSpecError(f"backend {parsed.name!r}: environment variable "
                                       f"{parsed.api_key_env} is not set")
        return OpenAIBackend(
            parsed.base_url, parsed.model, api_key=api_key, chat=parsed.chat,
            vllm_priority=parsed.vllm_priority, timeout_s=parsed.timeout_s,
            connect_timeout_s=parsed.connect_timeout_s, max_retries=parsed.max_retries,
            stream_usage=parsed.stream_usage, grammar_param=parsed.grammar_param,
            extra_body=parsed.extra_body, send_request_id=parsed.send_request_id,
            name=parsed.name)
    if isinstance(parsed, VLLMSpec):
        from agentflow.llm.vllm_engine import VLLMEngineBackend
        return VLLMEngineBackend(model=parsed.model, engine_args=parsed.engine_args,
                                 name=parsed.name)
    if isinstance(parsed, LlamaServerSpec):
        from agentflow.llm.llamacpp_server import LlamaServerBackend
        return LlamaServerBackend(parsed)
    from agentflow.llm.scripted import Fault, ScriptedBackend
    return ScriptedBackend(parsed.answers, default=parsed.default, latency_s=parsed.latency_s,
                           per_token_s=parsed.per_token_s, fail_after=parsed.fail_after,
                           fail_retryable=parsed.fail_retryable, name=parsed.name,
                           faults=[Fault(**f.model_dump()) for f in parsed.faults])
