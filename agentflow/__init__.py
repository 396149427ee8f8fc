"""agentflow: serve agentic Text-to-SQL pipelines on heterogeneous GPU clusters under SLOs."""

__version__ = "0.1.0"


_ERRORS = ("AgentflowError", "InvalidRequest", "ConversationNotFoundError",
           "DatabaseNotFoundError", "ShuttingDownError", "SqlError")


def __getattr__(name: str):
    # The API pulls in pipelines and backends; import it only when asked for.
    if name in ("connect", "AgentFlow", "Answer", "QueryHandle") or name in _ERRORS:
        from agentflow import api

        return getattr(api, name)
    raise AttributeError(name)


__all__ = ["connect", "AgentFlow", "Answer", "QueryHandle", *_ERRORS, "__version__"]
