"""One writer thread per state store: every write of the process goes through it.

Why: a server process writes from several threads at once (the HTTP loop creates queries,
the engine loop finishes them, the replica thread writes events and heartbeats). Each with
its own connection, they queue on SQLite's single write lock, and a blocked ``BEGIN
IMMEDIATE`` waits in SQLite's busy handler, which sleeps in steps of up to 100 ms — on the
thread that runs every pipeline. Here the writes queue in memory instead, and the writer
commits whatever has queued up in one transaction (group commit): under load, one commit
carries many queries' writes. Each write runs under its own savepoint, so one that fails
(a constraint, a bad value) fails alone and the rest of the batch still commits. A
caller that must read its write back — or have another replica read it, as a query id
returned to a client — waits on the write's future, which is set only after the commit;
one that need not (a finished query's answer, its last events) goes on at once.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

log = logging.getLogger("agentflow.state")

Q = Callable[..., list[tuple]]
Op = Callable[[Q], Any]
_STOP = object()


class Writer:
    """Runs ``op(q)`` calls in FIFO order on one thread, many per transaction."""

    def __init__(self, tx: Callable[[], AbstractContextManager[Q]], *, name: str = "state",
                 max_batch: int = 500):
        self._tx = tx
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"{name}-writer", daemon=True)
        self._thread.start()
        self.batches = 0  # transactions committed (for tests and benches)
        self.writes = 0

    def submit(self, op: Op) -> Future:
        """Queue ``op``; its future holds what it returned (or raised), once committed."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the state store is closed")
            self._queue.put((op, future))
        return future

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            ops = [item for item in batch if item is not _STOP]
            if ops:
                self._write(ops)
            if len(ops) != len(batch):
                return

    def _write(self, ops: list[tuple[Op, Future]]) -> None:
        outcomes: list[tuple[Future, BaseException | None, Any]] = []
        try:
            with self._tx() as q:
                for op, future in ops:
                    q("SAVEPOINT af_write")
                    try:
                        result = op(q)
                    except Exception as err:  # noqa: BLE001 - this write fails alone
                        q("ROLLBACK TO SAVEPOINT af_write")
                        outcomes.append((future, err, None))
                    else:
                        outcomes.append((future, None, result))
                    q("RELEASE SAVEPOINT af_write")
        except Exception as err:  # noqa: BLE001 - the commit failed: so did every write
            for _, future in ops:
                future.set_exception(err)
            return
        self.batches += 1
        self.writes += len(ops)
        for future, error, result in outcomes:  # after the commit: readable everywhere
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)


def log_failure(what: str) -> Callable[[Future], None]:
    """A done-callback for a write nobody waits on: its failure goes to the log."""
    def check(future: Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.error("state store: %s failed: %s", what, future.exception())
    return check
