"""Length models by name: what the coordinator believes about a call's length.

The coordinator asks its length model for a call's output-length distribution (``predict``),
tells it every finished call (``observe``) and asks whether a call's lengths are known in
advance (``true_lengths``). A runtime that knows the truth — only the simulator, replaying a
trace — hands it over with ``reveal``; every model but the oracle ignores it. So the same
runtime code drives every model, and which one is used is a name in a registry:

* ``learned`` — ``LengthPredictor``: stage priors plus semantic history (what serving uses).
* ``oracle`` — ``OraclePredictor``: the true prompt and output tokens of every call of a
  revealed query, for ready calls and for future stages alike. Simulation only; it is the
  yardstick that says how much better lengths could make a policy.

A policy name selects a model with ``@NAME`` (``hexgen-flow@oracle``); see
``agentflow.scheduler.policies.parse_policy``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


class OraclePredictor(LengthModel):
    """True lengths for every call of a revealed query; calls of unrevealed queries fall back
    to ``fallback`` (a learned predictor), which also keeps learning from every call."""

    def __init__(self, fallback: LengthModel | None = None):
        if fallback is None:
            from agentflow.scheduler.predictor import LengthPredictor

            fallback = LengthPredictor()
        self.fallback = fallback
        self._truth: dict[str, dict[str, TrueLengths]] = {}

    def predict(self, stage, key_text, input_tokens=None, *, max_tokens=None):
        return self.fallback.predict(stage, key_text, input_tokens, max_tokens=max_tokens)

    def observe(self, stage, key_text, output_tokens, input_tokens=None) -> None:
        self.fallback.observe(stage, key_text, output_tokens, input_tokens)

    def reveal(self, query_id: str, lengths: Mapping[str, TrueLengths]) -> None:
        self._truth[query_id] = dict(lengths)

    def forget(self, query_id: str) -> None:
        self._truth.pop(query_id, None)

    def true_lengths(self, query_id: str, node_id: str) -> TrueLengths | None:
        return self._truth.get(query_id, {}).get(node_id)


@dataclass(frozen=True)
class LengthModelKind:
    name: str
    help: str
    simulation_only: bool
    factory: Callable[[str], LengthModel]  # embedder name -> model


def _learned(embedder: str) -> LengthModel:
    from agentflow.scheduler.embedders import make_embedder
    from agentflow.scheduler.predictor import LengthPredictor

    return LengthPredictor(embedder=make_embedder(embedder))


PREDICTORS: dict[str, LengthModelKind] = {
    "learned": LengthModelKind("learned", "stage priors + similar past calls", False, _learned),
    "oracle": LengthModelKind("oracle", "true lengths of every call; simulation only", True,
                              lambda embedder: OraclePredictor(_learned(embedder))),
}
DEFAULT_PREDICTOR = "learned"


def make_predictor(name: str = DEFAULT_PREDICTOR, *, embedder: str = "hashing") -> LengthModel:
    if name not in PREDICTORS:
        raise ValueError(f"unknown length model {name!r}; choose from {', '.join(PREDICTORS)}")
    return PREDICTORS[name].factory(embedder)
