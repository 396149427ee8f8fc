"""What every length model is: ``predict``/``observe``, and the truth hooks only the oracle uses.

The coordinator asks its length model for a call's output-length distribution (``predict``),
tells it every finished call (``observe``) and asks whether a call's lengths are known in
advance (``true_lengths``). A runtime that knows the truth (only the simulator, replaying a
trace) hands it over with ``reveal``; every model but the oracle ignores it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentflow.scheduler.distribution import Distribution


@dataclass(frozen=True)
class TrueLengths:
    """A call's real sizes, as a trace recorded them (``duration_s``: a tool step's time)."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    duration_s: float | None = None


class LengthModel:
    """Base of every length model. Subclasses implement ``predict``/``observe``; the truth
    hooks are no-ops here, so a model that does not use the truth cannot see it."""

    def predict(self, stage: str, key_text: str, input_tokens: int | None = None, *,
                max_tokens: int | None = None) -> Distribution:
        raise NotImplementedError

    def observe(self, stage: str, key_text: str, output_tokens: float,
                input_tokens: int | None = None) -> None:
        raise NotImplementedError

    def reveal(self, query_id: str, lengths: Mapping[str, TrueLengths]) -> None:
        """The runtime knows a query's calls in advance (simulation): ignored by default."""

    def forget(self, query_id: str) -> None:
        """The query is over; drop whatever ``reveal`` kept."""

    def true_lengths(self, query_id: str, node_id: str) -> TrueLengths | None:
        """The call's real sizes when this model knows them; None: predict them."""
        return None
