"""One timer thread that interrupts queries past their deadline, for every database.

Engines check their own timeouts only at convenient points (SQLite's progress handler every N
VM steps, DuckDB between vectors), so a query made of a few very expensive steps — a 50 MB
``randomblob`` per row, a 2 GB ``repeat`` — never reaches one. An interrupt sent from another
thread (``sqlite3.Connection.interrupt``, ``duckdb.interrupt``, a PostgreSQL cancel request)
stops the step itself. One shared thread with a deadline heap serves all queries, so a busy
server does not start a thread per query.

A fired callback and ``cancel`` exclude each other under one lock: once ``cancel`` returns,
the callback will never run, so a pooled connection handed to the next query can never be
interrupted on behalf of the previous one.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._callbacks: dict[int, Callable[[], object]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, delay_s: float, callback: Callable[[], object]) -> int:
        """Call ``callback`` (from the watchdog thread) after ``delay_s`` unless cancelled."""
        with self._cond:
            token = next(self._ids)
            self._callbacks[token] = callback
            heapq.heappush(self._heap, (time.monotonic() + delay_s, token))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sql-watchdog",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
            return token

    def cancel(self, token: int) -> bool:
        """Disarm; returns False when the callback already ran (the query was interrupted)."""
        with self._cond:
            return self._callbacks.pop(token, None) is not None

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._callbacks:
                    heapq.heappop(self._heap)  # cancelled
                if not self._heap:
                    self._cond.wait(timeout=30.0)
                    if not self._heap:
                        self._thread = None
                        return
                    continue
                deadline, token = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(timeout=wait)
                    continue
                heapq.heappop(self._heap)
                callback = self._callbacks.pop(token, None)
                if callback is None:
                    continue
                try:  # under the lock: see the module docstring
                    callback()
                except Exception:  # noqa: BLE001 - a failed interrupt must not kill the thread
                    log.exception("SQL watchdog callback failed")


WATCHDOG = Watchdog()
