"""Helpers every test folder may use (each folder has its own ``utils.py`` beside it:
tests/scheduler/, tests/server/, tests/sql/)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wait_until(condition: Callable[[], object], timeout_s: float = 60.0,
               what: str = "") -> None:
    """Poll ``condition`` until it is true. The ceiling is generous on purpose: this waits
    on something observed (a state, an event), so a loaded machine makes it slower, never
    wrong; it fails, saying what it waited for, only if the state never comes."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout_s:g} s: "
                                 f"{what or getattr(condition, '__name__', condition)}")
        time.sleep(0.02)
