"""Length models by name: what the coordinator believes about a call's length.

The coordinator asks its length model for a call's output-length distribution, tells it every
finished call, and asks whether a call's lengths are known in advance (``base.LengthModel``).
The same runtime code drives every model; which one is used is a name in ``LENGTH_MODELS``:

* ``learned`` -- ``LearnedLengthModel``: stage priors plus semantic history (what serving uses).
* ``oracle`` -- ``OracleLengthModel``: the true prompt and output tokens of every call of a
  revealed query, for ready calls and for future stages alike. Simulation only.

A policy name selects a model with ``@NAME`` (``hexgen-flow@oracle``); see
``agentflow.scheduler.policies.parse_policy``. Adding a model is two edits: a ``LengthModel``
subclass and its ``LENGTH_MODELS`` entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentflow.scheduler.lengths.base import LengthModel, TrueLengths
from agentflow.scheduler.lengths.learned import LearnedLengthModel
from agentflow.scheduler.lengths.oracle import OracleLengthModel


@dataclass(frozen=True)
class LengthModelKind:
    name: str
    help: str
    simulation_only: bool
    factory: Callable[[str], LengthModel]  # embedder name -> model


def _learned(embedder: str) -> LengthModel:
    from agentflow.scheduler.embedders import make_embedder

    return LearnedLengthModel(embedder=make_embedder(embedder))


LENGTH_MODELS: dict[str, LengthModelKind] = {
    "learned": LengthModelKind("learned", "stage priors + similar past calls", False, _learned),
    "oracle": LengthModelKind("oracle", "true lengths of every call; simulation only", True,
                              lambda embedder: OracleLengthModel(_learned(embedder))),
}
DEFAULT_LENGTH_MODEL = "learned"


def make_length_model(name: str = DEFAULT_LENGTH_MODEL, *,
                      embedder: str = "hashing") -> LengthModel:
    if name not in LENGTH_MODELS:
        raise ValueError(f"unknown length model {name!r}; choose from {', '.join(LENGTH_MODELS)}")
    return LENGTH_MODELS[name].factory(embedder)


__all__ = ["DEFAULT_LENGTH_MODEL", "LENGTH_MODELS", "LearnedLengthModel", "LengthModel",
           "LengthModelKind", "OracleLengthModel", "TrueLengths", "make_length_model"]
