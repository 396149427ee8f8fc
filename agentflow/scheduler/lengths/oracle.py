"""The ``oracle`` length model: the true lengths of a revealed query's calls (simulation only).

It is the yardstick that says how much better lengths could make a policy; the invariant that
only this named model sees true lengths holds because every other model ignores ``reveal``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from agentflow.scheduler.lengths.base import LengthModel, TrueLengths
from agentflow.scheduler.lengths.learned import LearnedLengthModel

if TYPE_CHECKING:
    from agentflow.scheduler.distribution import Distribution


class OracleLengthModel(LengthModel):
    """True lengths for every call of a revealed query; calls of unrevealed queries fall back
    to ``fallback`` (a learned model), which also keeps learning from every call."""

    def __init__(self, fallback: LengthModel | None = None):
        self.fallback = fallback if fallback is not None else LearnedLengthModel()
        self._truth: dict[str, dict[str, TrueLengths]] = {}

    def predict(self, stage: str, key_text: str, input_tokens: int | None = None, *,
                max_tokens: int | None = None) -> Distribution:
        return self.fallback.predict(stage, key_text, input_tokens, max_tokens=max_tokens)

    def observe(self, stage: str, key_text: str, output_tokens: float,
                input_tokens: int | None = None) -> None:
        self.fallback.observe(stage, key_text, output_tokens, input_tokens)

    def reveal(self, query_id: str, lengths: Mapping[str, TrueLengths]) -> None:
        self._truth[query_id] = dict(lengths)

    def forget(self, query_id: str) -> None:
        self._truth.pop(query_id, None)

    def true_lengths(self, query_id: str, node_id: str) -> TrueLengths | None:
        return self._truth.get(query_id, {}).get(node_id)
