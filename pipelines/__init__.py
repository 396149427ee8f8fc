"""The Text-to-SQL pipelines agentflow ships, by name."""

from __future__ import annotations

from typing import Any

from agentflow.workflow.pipeline import Pipeline


def _registry() -> dict[str, type[Pipeline]]:
    from pipelines.chess import ChessPipeline
    from pipelines.macsql import MacSqlPipeline
    from pipelines.single import SinglePipeline

    return {"single": SinglePipeline, "chess": ChessPipeline, "macsql": MacSqlPipeline}


def pipeline_names() -> list[str]:
    return sorted(_registry())


def get_pipeline(name: str, **params: Any) -> Pipeline:
    """A pipeline by name with its parameters (e.g. ``chess``, n_candidates=5)."""
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown pipeline {name!r}; choose from {', '.join(sorted(registry))}")
    try:
        return registry[name](**params)
    except TypeError as err:
        raise ValueError(f"bad parameters for pipeline {name!r}: {err}") from None
