"""What the state store costs one replica per query, in CPU and wall time, without HTTP
or a pipeline around it (so the figure is not lost in a shared machine's noise).

    agentflow bench store_cost [--queries 400] [--threads 4] [--events 40]
    agentflow bench store_cost --quick          # 120 queries

Each query goes through what a replica writes for it, from ``--threads`` threads at once
(the HTTP loop, the engine loop and the replica's own thread all write in a real server):
``create_query`` and ``conversation_start`` (waited on: another replica may read them
the moment the id is returned), the events in batches of ``--batch`` (``add_events``),
``finish_query`` with a 20-row answer and ``conversation_add``. Printed: the process's CPU
milliseconds per query and queries/s, with the writes made inline by each thread (as before
the writer thread) and through the store's single writer thread (group commit), side by side
on one SQLite file each, alternating ``--rounds`` times; medians. Compare the CPU figure
with a CHESS query's own ~50–60 ms of server CPU (``replicas_load``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from agentflow.state import QueryRecord, QueryRequest
from agentflow.state.store import SqliteStore

QUICK_ARGS: tuple[str, ...] = ("--queries", "120", "--rounds", "2")


def lifecycle(store: SqliteStore, n_events: int, batch: int) -> None:
    query_id = uuid.uuid4().hex
    conversation = f"c-{uuid.uuid4().hex[:12]}"
    store.create_query(QueryRecord(query_id=query_id, tenant=None, owner="bench",
                                   request=QueryRequest(question="How many stores?",
                                                        db="bookshop", pipeline="chess")))
    store.conversation_start(conversation, None, "bookshop")
    events = [(i + 1, {"type": "stage_finished", "stage": f"stage-{i}", "at": time.time(),
                       "elapsed_s": 0.0123, "detail": "x" * 120}) for i in range(n_events)]
    for start in range(0, n_events - batch, batch):
        store.add_events({query_id: events[start:start + batch]},
                         running=[query_id] if start == 0 else (), owner="bench")
    answer: dict[str, Any] = {
        "query_id": query_id, "status": "done", "sql": "SELECT count(*) FROM stores",
        "columns": ["id", "name"], "rows": [[i, f"store {i}"] for i in range(20)],
        "details": {"stages": {f"stage-{i}": 0.01 for i in range(12)}}}
    last = events[max(0, n_events - batch):]
    store.finish_later(query_id, "bench", answer, last)
    store.conversation_add(conversation, "How many stores?", answer["sql"], 4, wait=False)


def run(mode: str, args: argparse.Namespace, folder: Path) -> tuple[float, float]:
    store = SqliteStore(folder / f"{mode}-{uuid.uuid4().hex[:6]}.sqlite",
                        writer=mode == "writer")
    per_thread = args.queries // args.threads
    cpu0, wall0 = time.process_time(), time.perf_counter()

    def work() -> None:
        for _ in range(per_thread):
            lifecycle(store, args.events, args.batch)

    threads = [threading.Thread(target=work) for _ in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()  # drains the writer: every write is counted
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    n = per_thread * args.threads
    return 1000 * cpu / n, n / wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=400)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--events", type=int, default=40, help="events per query")
    p.add_argument("--batch", type=int, default=10, help="events per add_events")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    results: dict[str, list[tuple[float, float]]] = {"inline": [], "writer": []}
    with tempfile.TemporaryDirectory(prefix="agentflow-store-cost-") as tmp:
        for _ in range(args.rounds):
            for mode in results:
                results[mode].append(run(mode, args, Path(tmp)))
    print(f"\n{args.queries} query lifecycles x {args.rounds} rounds, {args.threads} threads, "
          f"{args.events} events each (SQLite file, WAL); medians")
    print(f"{'writes':>8} {'CPU ms/query':>13} {'ratio':>6} {'queries/s':>10} {'ratio':>6}")
    base_cpu = statistics.median(r[0] for r in results["inline"])
    base_qps = statistics.median(r[1] for r in results["inline"])
    for mode, rows in results.items():
        cpu = statistics.median(r[0] for r in rows)
        qps = statistics.median(r[1] for r in rows)
        print(f"{mode:>8} {cpu:>13.2f} {cpu / base_cpu:>6.2f} {qps:>10.0f} "
              f"{qps / base_qps:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
