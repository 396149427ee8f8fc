"""An evaluation run beside page users on one served cluster: latency per SLO class.

    agentflow bench serving_classes [--policies flowsage,vllm] [--phase-s 30]
        [--preemption off,class,fair]

Issue 22's serving measurement, on loopback. For each policy it starts ``serve.py`` in a
subprocess (a free loopback port) with two API keys of different classes — ``page``
(``interactive``) and ``evalrun`` (``batch``) — on *scripted* instances (NOT a model: canned
SQL, ``--latency`` seconds before the first token and ``--per-token`` seconds per output
token, slept, so a call takes about as long as a short real one), and runs three phases on
the same server:

- ``interactive alone``: ``--users`` page users, each asking, waiting for the answer
  (``wait=true``), thinking ``--think`` seconds, asking again;
- ``batch alone``: an eval-like flood through the batch key — ``--batch-clients``
  questions always in flight (what ``agentflow eval --rate`` does at a rate the cluster cannot
  keep up with, bounded so the run measures queueing, not the admission bound);
- ``both``: the two at once.

Each phase lasts ``--phase-s`` seconds (answers to questions asked in its first
``--warmup-s`` are not counted). Latency is the server's own (the query's arrival to its
answer, ``latency_s`` in the response), so the clients' event loop on a busy machine is not
counted. Printed per policy and class: median and P95, answers per second, refused; then
the ratios that matter — interactive P95 with the flood over alone, and each policy's
interactive P95 under the flood over the first policy's. Ratios, not absolute claims: the
instances are scripted and the machine is shared.

``--preemption off,class`` runs each policy once per mode (``scheduler.preemption``; a run
with ``class`` is labelled ``POLICY+preempt``, one with ``fair`` ``POLICY+fair``; a policy
without the flowsage queue, where it cannot act, says so and runs off only): with single-slot
instances the page user's wait under the flood is the remainder of whichever batch call
holds the slot, which only stopping that call can shorten. ``--flood-class interactive``
puts the flooding key in the page users' class: two tenants of one class, where only fair
sharing (and ``--preemption fair``) can keep the flood off the page users' latency; its
lines still say ``batch`` for the flood.

Before the scheduler ranks by class (issue 22 §1-2, sched22's half) every call is ranked
alike and this measures today's behaviour; afterwards the same command shows the effect.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentflow.bench.serving.served import percentile, serve, stop_server
from agentflow.scheduler.preemption import PREEMPTION_SETTINGS, check_preemption

ROOT = Path(__file__).resolve().parents[3]
SQL = "SELECT count(*) AS n FROM stores"
PAGE_KEY, EVAL_KEY = "bench-page-key-0001", "bench-eval-key-0002"
QUESTIONS = ("How many stores are there?", "Count the stores.", "What is the number of stores?",
             "How many shops do we have?")


@dataclass
class ClassRun:
    """What one class got in one phase."""

    latencies: list[float] = field(default_factory=list)  # server latency of answered ones
    statuses: Counter = field(default_factory=Counter)
    measured_s: float = 0.0

    def line(self, label: str) -> str:
        n = len(self.latencies)
        if not n:
            return f"  {label:<12} no answers ({dict(self.statuses)})"
        rate = n / self.measured_s if self.measured_s else float("nan")
        other = {k: v for k, v in self.statuses.items() if k != "done"}
        return (f"  {label:<12} median {median(self.latencies):6.2f} s  P95 "
                f"{p95(self.latencies):6.2f} s  max {max(self.latencies):6.2f} s  {n:4d} "
                f"answered ({rate:5.2f}/s)"
                + (f"  other: {dict(other)}" if other else ""))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p95(values: list[float]) -> float:
    return percentile(values, 0.95)


def server_config(args: argparse.Namespace, policy: str, preemption: str = "off"
                  ) -> dict[str, Any]:
    instances = [{"name": f"scripted-{i}", "max_inflight": args.inflight,
                  "backend": {"type": "scripted", "name": f"scripted-{i}", "default": SQL,
                              "latency_s": args.latency, "per_token_s": args.per_token}}
                 for i in range(args.instances)]
    classes: dict[str, Any] = {}
    if args.interactive_slo is not None:
        classes["interactive"] = {"slo_seconds": args.interactive_slo}
    return {"fewshot": None, "pipeline": args.pipeline, "instances": instances,
            "scheduler": {"policy": policy, "slo_classes": classes, "preemption": preemption},
            "server": {"drain_s": 2, "tenants": [
                {"name": "page", "keys": [PAGE_KEY], "slo_class": "interactive"},
                {"name": "evalrun", "keys": [EVAL_KEY], "slo_class": args.flood_class}]}}


def start_server(args: argparse.Namespace, policy: str, preemption: str = "off"
                 ) -> tuple[subprocess.Popen, str]:
    proc, url, _ = serve(server_config(args, policy, preemption), prefix="agentflow-classes-")
    return proc, url


async def ask(http: httpx.AsyncClient, url: str, key: str, i: int) -> tuple[str, float | None]:
    body = {"question": QUESTIONS[i % len(QUESTIONS)], "db": "bookshop", "wait": True}
    try:
        r = await http.post(f"{url}/v1/queries", json=body, headers={"X-API-Key": key})
    except httpx.HTTPError as err:
        return type(err).__name__, None
    data = r.json()
    if r.status_code != 200:
        return f"{r.status_code} {data.get('error', {}).get('code', '')}", None
    return data["status"], data.get("latency_s")


async def client(http: httpx.AsyncClient, url: str, key: str, run: ClassRun, start: float,
                 args: argparse.Namespace, think_s: float, offset: int) -> None:
    """Ask until the phase ends; count answers to questions asked after the warm-up."""
    i = offset
    end = start + args.phase_s
    while time.perf_counter() < end:
        asked = time.perf_counter()
        status, latency = await ask(http, url, key, i)
        i += 1
        if asked - start >= args.warmup_s:
            run.statuses[status] += 1
            if status in ("done", "unsure") and latency is not None:
                run.latencies.append(latency)
        if status not in ("done", "unsure", "failed"):
            await asyncio.sleep(0.2)  # refused: back off a little, as a real client would
        elif think_s:
            await asyncio.sleep(think_s)


async def phase(url: str, args: argparse.Namespace, interactive: bool,
                batch: bool) -> dict[str, ClassRun]:
    runs = {"interactive": ClassRun(), "batch": ClassRun()}
    clients = (args.users if interactive else 0) + (args.batch_clients if batch else 0)
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        start = time.perf_counter()
        jobs = []
        if interactive:
            jobs += [client(http, url, PAGE_KEY, runs["interactive"], start, args, args.think,
                            u * 1000) for u in range(args.users)]
        if batch:
            jobs += [client(http, url, EVAL_KEY, runs["batch"], start, args, 0.0, c * 1000)
                     for c in range(args.batch_clients)]
        await asyncio.gather(*jobs)
    for run in runs.values():
        run.measured_s = max(1e-9, args.phase_s - args.warmup_s)
    return runs


async def measure(url: str, args: argparse.Namespace) -> dict[str, dict[str, ClassRun]]:
    async with httpx.AsyncClient(timeout=60) as http:  # first-use costs out of the figures
        for i in range(3):
            await ask(http, url, PAGE_KEY, i)
    return {"interactive alone": await phase(url, args, True, False),
            "batch alone": await phase(url, args, False, True),
            "both": await phase(url, args, True, True)}


def run_policy(args: argparse.Namespace, policy: str, preemption: str = "off"
               ) -> dict[str, dict[str, ClassRun]]:
    proc, url = start_server(args, policy, preemption)
    try:
        return asyncio.run(measure(url, args))
    finally:
        stop_server(proc, 30)


def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "agentflow"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() + (" (+ uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def report(results: dict[str, dict[str, dict[str, ClassRun]]]) -> list[str]:
    lines = []
    for policy, phases in results.items():
        lines.append(f"## {policy}")
        for name, runs in phases.items():
            lines.append(f" {name}:")
            for klass in ("interactive", "batch"):
                if runs[klass].statuses:
                    lines.append(runs[klass].line(klass))
    lines.append("## ratios (P95 unless said)")
    first = next(iter(results))
    for policy, phases in results.items():
        inter_both = p95(phases["both"]["interactive"].latencies)
        inter_alone = p95(phases["interactive alone"]["interactive"].latencies)
        batch_both = len(phases["both"]["batch"].latencies)
        batch_alone = len(phases["batch alone"]["batch"].latencies)
        lines.append(f" {policy}: interactive with the flood / alone = "
                     f"{inter_both / inter_alone:5.2f}x;  batch answers with page users / "
                     f"alone = {batch_both / max(1, batch_alone):5.2f}x")
        if policy != first:
            ref = p95(results[first]["both"]["interactive"].latencies)
            ref_med = median(results[first]["both"]["interactive"].latencies)
            ref_batch = len(results[first]["both"]["batch"].latencies)
            lines.append(f" {policy} / {first} with the flood: interactive P95 "
                         f"{inter_both / ref:5.2f}x, median "
                         f"{median(phases['both']['interactive'].latencies) / ref_med:5.2f}x; "
                         f"batch answers {batch_both / max(1, ref_batch):5.2f}x")
    return lines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="flowsage,vllm",
                   help="comma-separated serving policies, each on a fresh server")
    p.add_argument("--pipeline", default="single", help="single (one LLM call), macsql, chess")
    p.add_argument("--instances", type=int, default=2, help="scripted instances")
    p.add_argument("--inflight", type=int, default=1,
                   help="calls each instance runs at once (the rest wait in the scheduler)")
    p.add_argument("--latency", type=float, default=0.3,
                   help="scripted seconds before the first token (prefill)")
    p.add_argument("--per-token", type=float, default=0.2,
                   help="scripted seconds per output token (decode)")
    p.add_argument("--users", type=int, default=2, help="interactive page users")
    p.add_argument("--think", type=float, default=1.0, help="a page user's pause, seconds")
    p.add_argument("--batch-clients", type=int, default=8,
                   help="batch questions always in flight during the flood")
    p.add_argument("--interactive-slo", type=float, default=10.0,
                   help="the interactive class's deadline (slo_seconds); batch has none")
    p.add_argument("--phase-s", type=float, default=30.0, help="seconds per phase")
    p.add_argument("--warmup-s", type=float, default=4.0,
                   help="answers to questions asked in a phase's first seconds are not counted")
    p.add_argument("--flood-class", default="batch",
                   help="the flooding key's class (default batch); the page users' own, "
                        "interactive, measures two tenants of one class: fair sharing, and "
                        "what preemption 'fair' adds to it")
    p.add_argument("--preemption", default="off",
                   help="comma-separated scheduler.preemption settings (off, class, fair, "
                        "auto: the server's default), each "
                        "policy "
                        "run once per mode")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--policies", "flowsage", "--phase-s", "8", "--warmup-s", "2")


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    modes = [x.strip() for x in args.preemption.split(",") if x.strip()]
    if not modes or any(m not in PREEMPTION_SETTINGS for m in modes):
        p.error(f"--preemption takes {', '.join(PREEMPTION_SETTINGS)}, got {args.preemption!r}")
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    if not policies or args.phase_s <= args.warmup_s:
        p.error("give at least one policy, and --phase-s longer than --warmup-s")
    print(f"# serving_classes at {commit()}: {args.instances} scripted instances x "
          f"{args.inflight} slots, {args.latency:g} s + {args.per_token:g} s/token, pipeline "
          f"{args.pipeline}; {args.users} page users (think {args.think:g} s, class "
          f"interactive, slo {args.interactive_slo:g} s) beside {args.batch_clients} "
          f"questions in flight from a key of class {args.flood_class} (its lines say "
          f"batch); {args.phase_s:g} s phases", flush=True)
    results = {}
    for policy in policies:
        for mode in modes:
            try:
                check_preemption(mode, policy)
            except ValueError as err:  # said, not skipped silently: the off run stands
                print(f"# {policy}: no preemption run ({err})", flush=True)
                continue
            label = policy if mode == "off" else \
                f"{policy}+preempt" if mode == "class" else f"{policy}+{mode}"
            results[label] = run_policy(args, policy, mode)
            print("\n".join(report({label: results[label]})), flush=True)
    if len(results) > 1:
        print("# all policies")
        print("\n".join(report(results)))
    if args.json is not None:
        args.json.write_text(json.dumps(
            {"commit": commit(), "settings": vars(args) | {"json": str(args.json)},
             "results": {pol: {ph: {k: {"latencies": r.latencies,
                                        "statuses": dict(r.statuses),
                                        "measured_s": r.measured_s}
                                    for k, r in runs.items()}
                               for ph, runs in phases.items()}
                         for pol, phases in results.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
