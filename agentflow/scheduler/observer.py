"""Watching the coordinator's events (the server times each decision with this).

Each event method of ``Coordinator`` is decorated with ``observed``, by name in its class
body, so what observers see is visible where the event is defined."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

if TYPE_CHECKING:
    from agentflow.scheduler.decisions import Decision

P = ParamSpec("P")
R = TypeVar("R")


class CoordinatorObserver(Protocol):
    """Watches the coordinator's events (e.g. the server times each decision): told when an
    event method starts and when it returns, with the decisions it made (empty when it made
    none or raised). Events may nest (``cancel_query`` ends with ``on_query_done``)."""

    def event_started(self, event: str) -> None: ...

    def event_finished(self, event: str, decisions: list[Decision]) -> None: ...


class Observed(Protocol):
    """What ``observed`` needs of the object whose method it wraps."""

    _observers: list[CoordinatorObserver]


S = TypeVar("S", bound=Observed)


def observed(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Tell the object's observers when ``method`` (an event) starts and returns."""
    name = method.__name__

    @functools.wraps(method)
    def event(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if not self._observers:
            return method(self, *args, **kwargs)
        for observer in self._observers:
            observer.event_started(name)
        result: Any = None
        try:
            returned = method(self, *args, **kwargs)
            result = returned
            return returned
        finally:
            # Event methods return decisions, or (call(s), decisions), or no decision at all.
            if isinstance(result, tuple) and result and isinstance(result[-1], list):
                result = result[-1]
            decisions = result if isinstance(result, list) else []
            for observer in self._observers:
                observer.event_finished(name, decisions)
    return event
