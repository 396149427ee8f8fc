"""A bounded, thread-safe memo keyed by SQL text, for results that are a pure function of the
key: the answer-shape verdicts and the guard's accepted statements both keep one.

Why bounded twice: by entries (least recently used dropped first) and by the length of the
text a key holds, so a flood of long generated statements cannot fill memory with keys that
are unlikely to come back. Why a lock: the guard fills these from database threads while the
engine loop reads them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TextMemo(Generic[K, V]):
    """``get``/``put`` over at most ``keep`` entries; a key whose text (``text_of(key)``) is
    longer than ``keep_chars`` is never kept."""

    def __init__(self, keep: int, keep_chars: int, text_of: Callable[[K], str]):
        self.keep = keep
        self.keep_chars = keep_chars
        self._text_of = text_of
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def keeps(self, key: K) -> bool:
        """Whether ``put`` would keep ``key`` (its text is short enough)."""
        return len(self._text_of(key)) <= self.keep_chars

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def peek(self, key: K) -> V | None:
        """The value kept for ``key`` without marking it used."""
        with self._lock:
            return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        if not self.keeps(key):
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.keep:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


__all__ = ["TextMemo"]
