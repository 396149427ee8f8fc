"""Helpers for the SQL tests: observe the watchdog's interrupts and the parser's calls
instead of timing them."""

from __future__ import annotations


def record_watchdog_fires(monkeypatch) -> list[str]:
    """Record each time the SQL watchdog interrupts a query (the engine kind it interrupted),
    so a timeout test can observe the interrupt instead of timing it on a loaded machine."""
    from agentflow.sql.database import _Interrupter

    fired: list[str] = []
    original = _Interrupter._fire

    def fire(self: _Interrupter) -> None:
        fired.append(self.kind)
        original(self)

    monkeypatch.setattr(_Interrupter, "_fire", fire)
    return fired


def record_parsing(monkeypatch) -> list[str]:
    """Record every sqlglot tokenize/parse/transpile call, so a test can show a statement was
    rejected before any parser ran (a counted step, not a stopwatch)."""
    import sqlglot
    from sqlglot.dialects.dialect import Dialect

    calls: list[str] = []
    for owner, name in ((Dialect, "tokenize"), (Dialect, "parse"), (sqlglot, "transpile"),
                        (sqlglot, "parse"), (sqlglot, "parse_one")):
        original = getattr(owner, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    return calls
