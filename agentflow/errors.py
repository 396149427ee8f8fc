"""The exceptions agentflow raises to its callers, in one family.

``except agentflow.AgentflowError`` catches every error that is about the caller's input or
agentflow's state (not bugs). Each subclass also derives from the built-in it refines, so code
written against ``ValueError``/``LookupError``/``RuntimeError`` keeps working.

    AgentflowError
    ├── InvalidRequest (ValueError)            empty/too long question, bad SLO, unknown pipeline
    │   └── ConversationNotFoundError          follow-up on an unknown/forgotten conversation
    ├── DatabaseNotFoundError (LookupError)    unknown database id or missing file
    ├── SqlError                               one SQL statement failed (syntax, timeout, ...)
    └── ShuttingDownError (RuntimeError)       a question after close() began
"""

from __future__ import annotations


class AgentflowError(Exception):
    """Base of every error agentflow raises on purpose."""


class InvalidRequest(AgentflowError, ValueError):
    """The request cannot be run as given (empty question, bad SLO, unknown pipeline)."""


class ConversationNotFoundError(InvalidRequest):
    """A follow-up names a conversation this agentflow does not know (or no longer keeps)."""


class ShuttingDownError(AgentflowError, RuntimeError):
    """agentflow is closing and takes no new questions."""


__all__ = ["AgentflowError", "InvalidRequest", "ConversationNotFoundError",
           "ShuttingDownError"]
