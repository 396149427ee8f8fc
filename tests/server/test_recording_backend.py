"""The server's failure-recording wrapper must be transparent to the scheduler: whatever the
router asks a backend (its tokenizer above all) it must ask the real one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from agentflow.llm.base import LLMBackend, LLMRequest, LLMResult
from agentflow.server.prometheus import ServerMetrics
from agentflow.server.service import FailureLog, RecordingBackend


class WordCounter(LLMBackend):
    """A backend whose tokenizer differs from the base class's chars/4 rule (never called to
    generate: only its token counting is under test)."""

    async def generate(self, request: LLMRequest, on_progress=None) -> LLMResult:
        raise NotImplementedError

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    @property
    def tokenizer_key(self) -> tuple:
        return ("words",)


def test_the_wrapper_reports_the_inner_backends_tokenizer() -> None:
    wrapped = RecordingBackend(WordCounter(), "cpu-0", FailureLog(),
                               ServerMetrics(CollectorRegistry()))
    assert wrapped.tokenizer_key == ("words",)
    assert wrapped.count_tokens("how many stores are there") == 5
