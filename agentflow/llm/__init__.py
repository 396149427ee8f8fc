"""LLM backends behind one interface (``base``): local llama.cpp, OpenAI-compatible HTTP,
in-process vLLM, and a scripted stand-in for tests.

``LocalLlamaBackend`` is loaded on first access so that importing this package does not need
llama-cpp-python (an optional extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentflow.llm.base import (
    BackendError,
    LLMBackend,
    LLMRequest,
    LLMResult,
    ProgressCallback,
    SamplingParams,
)
from agentflow.llm.grammars import SQL_AFTER_SELECT_GBNF, SQL_SELECT_GBNF, sql_select_grammar
from agentflow.llm.openai_compat import OpenAIBackend
from agentflow.llm.registry import BackendSpecError, create_backend, parse_backend_spec
from agentflow.llm.scripted import ScriptedBackend
from agentflow.llm.vllm_engine import VLLMEngineBackend

if TYPE_CHECKING:
    from agentflow.llm.local import LocalLlamaBackend

__all__ = [
    "BackendError", "BackendSpecError", "LLMBackend", "LLMRequest", "LLMResult",
    "LocalLlamaBackend", "OpenAIBackend", "ProgressCallback", "SQL_AFTER_SELECT_GBNF",
    "SQL_SELECT_GBNF", "SamplingParams", "ScriptedBackend", "VLLMEngineBackend",
    "create_backend", "parse_backend_spec", "sql_select_grammar",
]


def __getattr__(name: str) -> Any:
    if name == "LocalLlamaBackend":
        from agentflow.llm.local import LocalLlamaBackend
        return LocalLlamaBackend
    raise AttributeError(f"module 'agentflow.llm' has no attribute {name!r}")
