"""create_backend / parse_backend_spec: validation errors are clear and early."""

from __future__ import annotations

import asyncio

import pytest

from agentflow.llm import (
    BackendSpecError,
    OpenAIBackend,
    ScriptedBackend,
    create_backend,
    parse_backend_spec,
)
from agentflow.llm.registry import LocalSpec, OpenAISpec


def test_unknown_and_missing_type():
    with pytest.raises(BackendSpecError, match="unknown backend type 'gpt'.*local, openai"):
        parse_backend_spec({"type": "gpt"})
    with pytest.raises(BackendSpecError, match="no 'type'"):
        parse_backend_spec({"model": "x"})
    with pytest.raises(BackendSpecError, match="mapping"):
        parse_backend_spec(["local"])  # type: ignore[arg-type]


def test_missing_extra_and_bad_fields_are_named():
    with pytest.raises(BackendSpecError, match="invalid 'openai'.*base_url: Field required"):
        parse_backend_spec({"type": "openai", "model": "m"})
    with pytest.raises(BackendSpecError, match="n_thread"):
        parse_backend_spec({"type": "local", "n_thread": 2})  # typo of n_threads
    with pytest.raises(BackendSpecError, match="n_ctx"):
        parse_backend_spec({"type": "local", "n_ctx": 0})
    with pytest.raises(BackendSpecError, match="model"):
        parse_backend_spec({"type": "vllm"})


def test_valid_specs_parse_with_defaults():
    local = parse_backend_spec({"type": "local", "model_path": "/m.gguf", "n_threads": 2})
    assert isinstance(local, LocalSpec) and local.n_ctx == 4096 and not local.use_extra_bufts
    remote = parse_backend_spec({"type": "openai", "base_url": "http://h:8000/v1",
                                 "model": "llama", "vllm_priority": True})
    assert isinstance(remote, OpenAISpec) and remote.vllm_priority and remote.max_retries == 0


def test_create_scripted_backend_from_spec():
    backend = create_backend({"type": "scripted", "answers": {"s": ["a", "b"]},
                              "latency_s": 0.0, "name": "fake-1"})
    assert isinstance(backend, ScriptedBackend) and backend.name == "fake-1"


def test_create_openai_backend_reads_key_from_named_env(monkeypatch):
    pytest.importorskip("openai")
    spec = {"type": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
            "api_key_env": "AGENTFLOW_TEST_KEY"}
    monkeypatch.delenv("AGENTFLOW_TEST_KEY", raising=False)
    with pytest.raises(BackendSpecError, match="AGENTFLOW_TEST_KEY is not set"):
        create_backend(spec)
    monkeypatch.setenv("AGENTFLOW_TEST_KEY", "sk-test")
    backend = create_backend(spec)
    assert isinstance(backend, OpenAIBackend)
    asyncio.run(backend.close())


def test_create_vllm_without_vllm_installed_says_how_to_get_it():
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    with pytest.raises(ImportError, match="agentflow\\[vllm\\]"):
        create_backend({"type": "vllm", "model": "meta-llama/Llama-3.1-8B"})


def test_create_local_with_missing_model_file_fails_clearly(tmp_path):
    pytest.importorskip("llama_cpp")
    with pytest.raises(FileNotFoundError, match="GGUF model not found"):
        create_backend({"type": "local", "model_path": str(tmp_path / "none.gguf")})


def test_every_listed_spec_builds_itself_and_has_a_unique_type():
    from agentflow.llm.registry import KNOWN_TYPES, SPECS, BackendSpec
    assert len(set(KNOWN_TYPES)) == len(SPECS) == len(KNOWN_TYPES)
    assert all(cls.build is not BackendSpec.build for cls in SPECS)
    spec = parse_backend_spec({"type": "scripted"})
    assert parse_backend_spec(spec) is spec
