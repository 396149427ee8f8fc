"""Replay a trace's LLM calls on real engines and in the simulator; print how far apart they are.

    agentflow bench real_vs_sim --cluster examples/cluster-llama-server-2cpu.yaml \\
        --trace ../shared/traces/hexgen-flow/trace1.json --rate 0.05 [--quick]
    agentflow bench real_vs_sim --cluster FILE --calibrate      # fit the CPU profile

Both sides get the same workload: the trace's first queries (HexGen-Flow or agentflow format,
``agentflow.sim.workload.load_trace``), Poisson arrivals at ``--rate`` (seeded), each query's
stages run in its recorded DAG order (a stage starts when its parents finish, in real time on
the real side, in simulated time on the other), every call on the same instance on both sides
(``--assign query``: a query's calls stay on one instance, so its parallel candidates and
evaluations batch there; ``call``: round-robin over calls). Real side: the cluster file's
instances as serving starts them (``create_backend``); each call is a synthetic prompt of the
recorded token count (random common words, unique per call so no prompt cache helps) with
``max_tokens`` = the recorded output and end of text ignored (``ignore_eos``), so the engine
does exactly the recorded work. Simulated side: ``agentflow.sim.engine`` instances built from
the same file's hardware profiles (``gpu``/``model``), with the engine's limits taken from the
backend (llama-server: ``parallel`` slots, ``batch`` tokens per step). No scheduler runs on
either side: this checks the engine physics, not a policy.

Token counts. Recorded calls of a 70B GPU deployment (12k-token prompts, 660-token answers)
take minutes each on a 270M model on one CPU core, so ``--scale`` multiplies every prompt and
output length (default 0.1 with ``--quick``, 1.0 otherwise; rounded, at least 1 token) and
``--max-prompt`` / ``--max-output`` cap them afterwards (default: none). The same scaled counts
go to both sides, and the header says what was used.

Errors: per call, ``|sim - real| / real`` of the call's latency (submit to last token, as
the caller sees it); per query, of its end-to-end latency (arrival to last call done). The
last three lines are ``engine work sim/real per instance: X, Y, ...`` (simulated busy
seconds of each engine over its server's CPU seconds during the replay, from /proc: the
figure contention on a shared machine barely moves, since a server waiting for a core is
not charged CPU time; n/a where a backend reports none, e.g. remote vLLM servers),
``median |sim-real|/real per call: X`` and ``P95 error per query: Y``. Before them, where
the instance's host profile stored one (``agentflow calibrate``), ``engine work sim/real,
load-matched per instance: ...``: a fixed set of requests (``host_calibration.SPEED_PROBE``)
timed on each server's CPU clock right before and right after the replay, over what it cost
at calibration, says how much more CPU the same work cost around the replay (co-running
processes raise CPU seconds per unit of work, which no clock removes); the real CPU seconds
divided by that factor give the second figure (``--no-speed-probe`` skips it). A local instance is
simulated on this host's profile where ``agentflow calibrate --cluster FILE`` stored one
(the header says which profile each instance uses), and the engine work on the stored
profiles is printed beside it.

Where the error lives (``attribution.py``): each call split into queue / prefill / decode on
both sides (llama-server's own ``timings`` on the real side), summed by how many calls were
in flight on its instance, printed and kept per call in ``--json``. How quiet the machine was
(``environment.py``: CPU used by other processes, load range) and how fast each engine was
against its profile just before and after the replay (``probe.py``: a few single requests;
they also warm the servers) are printed with every run, with a *probe-corrected* figure
beside the raw ones (``--no-probe`` skips them). ``--resim JSON`` runs only the simulator
against the real side an earlier ``--json`` saved, to check a simulator change on
measurements already taken. ``--repeat RUN1.json RUN2.json ...`` compares earlier runs' real
sides with each other: how far a second real run of the same arrivals is from the first,
speed-matched as the simulator is, and the floor that puts under the simulator's error
(``repeat.py``: why and how).

``--calibrate-first`` times, just before the replay, a few lone requests of the workload's
own call shapes on every instance at once and fits each instance's compute speed, memory
speed and per-request cost on top of its stored profile (``precalibrate.py``: what it
measures and why); the replay is then simulated on both, the stored profile's figures are
printed (``stored profile: ...``) and the last two lines are the calibrated ones. It never
sees the replay's timings; ``--resim`` refits the rows the run saved. The worst queries'
critical chains, phase by phase, and how often each engine served two waiting calls in the
other order than the real server are printed with every figure (``chain.py``).

Sends: both sides send the calls ready for one instance in trace order, ``--send-gap`` apart
(``SEND_GAP_S``; runs saved before it were sent at once and re-simulate with 2 ms).

``--calibrate`` runs single requests (one at a time, on the first instance) over a grid of
prompt and output lengths and fits the hardware profile's efficiencies and overheads by least
squares of the simulator's single-request latency (prefill and decode time, relative error),
then prints the profile to put in ``agentflow/hardware.py``. The replay never fits anything.
The measuring and the fit are ``agentflow.sim.host_calibration``'s, which ``agentflow
calibrate`` uses too (it stores the fit for this host instead of printing it).

On a GPU fleet the same command checks vLLM servers: give it a cluster file whose instances
are ``backend: {type: openai, base_url: ..., extra_body: {ignore_eos: true}}`` with their
``gpu``/``model``/``tensor_parallel``/``max_num_seqs``/``max_num_batched_tokens`` as deployed
(see docs/simulator.md, "Checking the simulator against real engines").
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentflow import hardware
from agentflow.bench.fidelity import repeat
from agentflow.bench.fidelity.attribution import (
    Split,
    breakdown,
    in_flight_at_submit,
    per_call_records,
    print_breakdown,
    real_split,
    sim_split,
)
from agentflow.bench.fidelity.chain import print_worst_queries
from agentflow.bench.fidelity.environment import Quietness, background_share
from agentflow.bench.fidelity.figures import call_figures, p95
from agentflow.bench.fidelity.normalise import instance_slowdowns, lone_calls, machine_factors
from agentflow.bench.fidelity.precalibrate import describe, fit_speed, measure_lone, workload_shapes
from agentflow.bench.fidelity.probe import (
    BEFORE_WEIGHT,
    instance_priced,
    load_factors,
    load_matched,
    load_matched_line,
    predicted_factors,
    pricing_note,
    probe,
    speed_probes,
    speed_references,
)
from agentflow.event_loop import close_loop
from agentflow.sim.cluster import load_cluster
from agentflow.sim.engine import SimInstance, engine_for
from agentflow.sim.host_calibration import (
    FIT_FIELDS,
    STORED_FIELDS,
    PromptMaker,
    close_all,
    cpu_seconds,
    engine_limits,
    fit_rows,
    measure_calibration,
    sim_single,
    start_backends,
    tokenizer_of,
)
from agentflow.sim.workload import TraceQuery, arrival_times, load_trace


# ------------------------------------------------------------------------------ workload
@dataclass(frozen=True)
class Call:
    """One LLM call of a replayed query, with the token counts both sides use."""

    id: str
    query: int
    parents: tuple[str, ...]
    prompt_tokens: int
    output_tokens: int
    instance: str


@dataclass
class Workload:
    arrivals: list[float]
    calls: list[list[Call]]  # per query, in trace order
    scale: float
    max_prompt: int | None
    max_output: int | None
    # both sides send the calls ready for one instance this far apart (SEND_GAP_S)
    send_gap_s: float = 0.02


def scaled(n: int, scale: float, cap: int | None) -> int:
    value = max(1, round(n * scale))
    return min(value, cap) if cap is not None else value


def build_workload(queries: list[TraceQuery], instances: list[str], *, rate: float,
                   seed: int, scale: float, max_prompt: int | None, max_output: int | None,
                   assign: str, send_gap_s: float | None = None) -> Workload:
    """Arrivals and calls; tool steps (agentflow traces) are dropped and their children
    depend on the tool's parents, since only the LLM engines are being compared."""
    arrivals = [float(t) for t in arrival_times(len(queries), rate, seed=seed)]
    out: list[list[Call]] = []
    k = 0
    for qi, q in enumerate(queries):
        llm = {n.id for n in q.nodes if n.kind == "llm"}
        by_id = {n.id: n for n in q.nodes}

        calls = []
        for n in q.nodes:
            if n.kind != "llm":
                continue
            inst = instances[qi % len(instances)] if assign == "query" else \
                instances[k % len(instances)]
            k += 1
            calls.append(Call(f"q{qi}/{n.id}", qi, tuple(f"q{qi}/{p}" for p in
                                                         sorted(_llm_parents(by_id, llm, n.id))),
                              scaled(n.prompt_tokens, scale, max_prompt),
                              scaled(n.output_tokens, scale, max_output), inst))
        out.append(calls)
    return Workload(arrivals, out, scale, max_prompt, max_output,
                    SEND_GAP_S if send_gap_s is None else send_gap_s)


def _llm_parents(by_id: dict, llm: set[str], node_id: str) -> set[str]:
    """The nearest LLM ancestors of a node, looking through tool steps."""
    found: set[str] = set()
    stack, seen = list(by_id[node_id].parents), set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        if p in llm:
            found.add(p)
        else:
            stack.extend(by_id[p].parents)
    return found


@dataclass
class Outcome:
    """Per call: submit and finish times (s from the first arrival); per query: latency."""

    submit: dict[str, float] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    prompt_tokens: dict[str, int] = field(default_factory=dict)  # as the engine counted
    # queue / prefill / decode of each call (attribution.py): the simulator's events, or
    # the caller's clock with the engine's own timings
    split: dict[str, Split] = field(default_factory=dict)
    engine_timings: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    environment: dict[str, float] = field(default_factory=dict)  # environment.py
    environment_line: str = ""
    wall_s: float = 0.0
    # Real side: per instance, the share of a core its server got while it had work (CPU
    # seconds of the process over the wall seconds with a call in flight).
    cpu_share: dict[str, float] = field(default_factory=dict)
    # Per instance, the engine's work: real side, the server process's CPU seconds over the
    # replay (/proc); simulated side, the seconds its engine spent in iterations.
    engine_s: dict[str, float] = field(default_factory=dict)
    # Simulated side with a co-run factor (``agentflow.sim.host_corun``): per instance, the
    # factor its iterations took while no other engine was busy, and the busy seconds so
    # priced (empty: no factor, every engine at its profile's constants throughout)
    alone_factor: dict[str, float] = field(default_factory=dict)
    alone_busy_s: dict[str, float] = field(default_factory=dict)

    def call_latency(self, cid: str) -> float:
        return self.finish[cid] - self.submit[cid]

    def query_latency(self, w: Workload, qi: int) -> float:
        return max(self.finish[c.id] for c in w.calls[qi]) - w.arrivals[qi]


# ----------------------------------------------------------------------------- simulator
def sim_engines(cluster_path: str, profiles: dict[str, hardware.GPUProfile] | None = None
                ) -> dict[str, SimInstance]:
    """The simulated engine of every instance, with the limits its backend really has
    (``profiles``: per instance, a hardware profile in place of its named one)."""
    cluster = load_cluster(cluster_path)
    return {name: engine_for(name, engine_limits(cfg), (profiles or {}).get(name))
            for name, cfg in cluster.expanded()}


# Calls that become ready together reach a server one after another: the real side is one
# client sending each on its own loopback connection, and llama-server starts a step as soon
# as the first is in, so the rest wait for that step (measured: of four 96-token evaluations
# sent at once, one ran its first chunk alone, 0.45 s, the other three joined the next step).
# Sent at once, which one the server got first was a coin toss (of sibling calls submitted
# together in four recorded replays, the later one in trace order started first in 200 pairs
# of 419 told apart), and when prompts overflow a step the first in runs its prompt a step
# ahead. So both sides send the calls that are ready for an instance in trace order, this far
# apart: the real side waits before each send (a wait the caller's latency includes), the
# simulated one adds them this far apart and counts the gap as queue.
SEND_GAP_S = 0.02
OLD_SEND_GAP_S = 0.002  # what runs saved without ``send_gap`` were simulated with


def replay_sim(w: Workload, engines: dict[str, SimInstance],
               send_gap_s: float | None = None, *, corun: bool = True,
               background: float = 0.0) -> Outcome:
    """Event-driven DAG replay in virtual time: a call is added to its engine when its last
    parent finishes (at least ``send_gap_s``, default the workload's, after the previous
    call sent to that engine); engines advance to the earliest pending event across all of
    them. With ``corun`` the engines are one host's (``agentflow.sim.host_corun``): each
    runs at its profile's ``cpu_alone_factor`` while no other is busy (``background``: the
    share of the machine other processes kept busy on the real side)."""
    from agentflow.sim.host_corun import CoRun

    if send_gap_s is None:
        send_gap_s = w.send_gap_s
    t_start = time.perf_counter()
    out = Outcome()
    host = CoRun(engines, background) if corun else None
    if host is not None:
        host.update(0.0)
    last_sent: dict[str, float] = {}
    sent_late: dict[str, float] = {}  # the send gap, counted as queue
    children: dict[str, list[Call]] = {}
    missing: dict[str, int] = {}
    ready: list[tuple[float, int, Call]] = []
    order = 0
    for qi, calls in enumerate(w.calls):
        for c in calls:
            missing[c.id] = len(c.parents)
            for p in c.parents:
                children.setdefault(p, []).append(c)
            if not c.parents:
                heapq.heappush(ready, (w.arrivals[qi], order, c))
                out.submit[c.id] = w.arrivals[qi]
                order += 1
    # Calls ready by the time last reached go in before any engine plans its next iteration
    # (``next_event_time`` plans it), so an engine starting work at t sees the neighbours
    # that start at t too (``CoRun``); each engine holds a new call in its front end for
    # its request overhead, so this order changes no engine's own iterations.
    frontier = float("-inf")
    while True:
        if ready and ready[0][0] <= frontier:
            t_engine = name = None
        else:
            t_engine, name = min(((e.next_event_time(), n) for n, e in engines.items()
                                  if e.next_event_time() is not None), default=(None, None))
        if ready and (t_engine is None or ready[0][0] < t_engine):
            t, n, c = heapq.heappop(ready)
            earliest = last_sent.get(c.instance, float("-inf")) + send_gap_s
            if t < earliest:
                heapq.heappush(ready, (earliest, n, c))
                continue
            last_sent[c.instance] = t
            sent_late[c.id] = t - out.submit[c.id]
            engines[c.instance].add(c.id, c.prompt_tokens, c.output_tokens, 0, t)
            frontier = max(frontier, t)
            if host is not None:
                host.update(t)
            continue
        if t_engine is None or name is None:
            break
        frontier = t_engine
        events = engines[name].step_until(t_engine)
        if host is not None:
            host.update(t_engine)
        for ev in events:
            if ev.kind != "finished":
                continue
            out.finish[ev.seq_id] = ev.time
            out.split[ev.seq_id] = sim_split((ev.queue_s or 0.0) + sent_late[ev.seq_id],
                                             ev.ttft_s or 0.0, ev.total_s or 0.0)
            for child in children.get(ev.seq_id, ()):
                missing[child.id] -= 1
                if missing[child.id] == 0:
                    heapq.heappush(ready, (ev.time, order, child))
                    out.submit[child.id] = ev.time
                    order += 1
    out.wall_s = time.perf_counter() - t_start
    out.engine_s = {n: e.busy_s for n, e in engines.items()}
    if host is not None and host.active:
        out.alone_busy_s = host.finish()
        out.alone_factor = host.factors()
    return out


def engine_work(real: Outcome, sim: Outcome) -> dict[str, float]:
    """Per instance, simulated busy seconds over the server's CPU seconds: the figure noise
    on a shared machine barely moves (a server that waits for a core is not charged CPU
    time, where its wall-clock latencies stretch), so it tests the engine physics."""
    return {n: sim.engine_s[n] / real.engine_s[n] for n in sim.engine_s
            if real.engine_s.get(n)}


def priced_engines(cluster_path: str, factors: dict[str, float] | None = None
                   ) -> dict[str, SimInstance]:
    """``sim_engines`` with each engine of ``factors`` slowed by its factor on top of its
    own pricing (the headline's: ``probe.predicted_factors``)."""
    engines = sim_engines(cluster_path)
    for name, f in (factors or {}).items():
        engines[name].slowdown *= f
    return engines


def corun_replay(w: Workload, cluster_path: str, environment: dict, sim: Outcome,
                 real: Outcome | None, factors: dict[str, float] | None = None
                 ) -> dict[str, Any]:
    """Where the host profile has a co-run factor (``agentflow.sim.host_corun``): what it
    priced in ``sim`` (the headline's replay, priced before the real side ran: the factor
    in full while an engine's neighbours are idle), and beside it the figures of the replay
    with the factor off and with the other processes' share of the machine the real side
    measured as background (a core beside their work is not alone; measured during the
    replay, so it may not price the headline). ``factors``: the headline's per-instance
    factors (``priced_engines``), kept in both. Empty where no engine has a factor."""
    if not sim.alone_factor:
        return {}
    background = background_share(environment)
    off = replay_sim(w, priced_engines(cluster_path, factors), corun=False)
    info: dict[str, Any] = {"background": background, "factor": sim.alone_factor,
                            "alone_busy_s": sim.alone_busy_s, "busy_s": sim.engine_s,
                            "busy_s_corun_off": off.engine_s}
    print("co-run pricing (agentflow.sim.host_corun): " + "; ".join(
        f"{n} x{sim.alone_factor[n]:.3f} while its neighbours are idle, "
        f"{sim.alone_busy_s.get(n, 0.0):.1f} of {sim.engine_s[n]:.1f} busy s so priced"
        for n in sim.engine_s) + f" (other processes kept {background * 100:.1f}% of the "
        "machine busy during the replay: the headline does not know it)")
    if real is not None and real.engine_s:
        info["engine_work_corun_off"] = engine_work(real, off)
        print(engine_work_line(info["engine_work_corun_off"], "co-run off"))
        if background > 0:
            bg = replay_sim(w, priced_engines(cluster_path, factors), background=background)
            info["engine_work_background"] = engine_work(real, bg)
            print(engine_work_line(info["engine_work_background"], "co-run factor on the "
                                   f"{(1 - background) * 100:.1f}% of the machine the replay "
                                   "left idle (measured during it: not predictive)"))
    return info


def engine_work_line(work: dict[str, float], variant: str | None = None,
                     pricing: str | None = None) -> str:
    """The ``engine work sim/real per instance`` line; ``variant`` names another replay's
    figure (``..., co-run off: ...``), printed beside the headline; ``pricing`` says what
    the headline's simulated engines were priced at (``probe.pricing_note``)."""
    names = ", ".join(work) + (f"; {pricing}" if pricing else "")
    return ("engine work sim/real per instance" + (f", {variant}" if variant else "") + ": "
            + (", ".join(f"{v:.3f}" for v in work.values()) or "n/a (no CPU seconds)")
            + (f" ({names})" if work else ""))


def stored_engines(cluster_path: str) -> dict[str, SimInstance]:
    """``sim_engines`` with every instance on its named profile (no host profile)."""
    cluster = load_cluster(cluster_path)
    return sim_engines(cluster_path, {n: hardware.gpu(str(c.gpu))
                                      for n, c in cluster.expanded()})


def profile_sources(cluster_path: str) -> dict[str, str]:
    """Per instance: which profile the simulator uses for it, and where it was fitted."""
    from agentflow.sim import host_profiles

    out = {}
    for name, cfg in load_cluster(cluster_path).expanded():
        entry = None
        if (cfg.backend or {}).get("type") == "llama_server":
            entry = host_profiles.lookup(str(cfg.gpu), str(cfg.model))
        if entry is not None:
            out[name] = (f"host profile of {entry.base} ({entry.host.describe()}, fitted "
                         f"{entry.fitted_at}" + (f", co-run factor {entry.alone_factor:.3f}"
                                                 if entry.alone_factor != 1.0 else "") + ")")
        else:
            where = hardware.FITTED_ON.get(str(cfg.gpu))
            out[name] = f"stored profile {cfg.gpu}" + (f" (fitted on {where[0]})"
                                                       if where else "")
    return out


# ---------------------------------------------------------------------------------- real
class _Sender:
    """One instance's sends, ``gap_s`` apart, the ready calls in trace order (``SEND_GAP_S``):
    a call waits for its turn, and each turn goes to the lowest trace position waiting."""

    def __init__(self, gap_s: float):
        self.gap_s = gap_s
        self._waiting: list[tuple[int, asyncio.Future]] = []
        self._busy = False
        self._last = float("-inf")

    async def turn(self, position: int) -> None:
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (position, fut))
        if not self._busy:
            self._busy = True
            asyncio.ensure_future(self._run())
        await fut

    async def _run(self) -> None:
        try:
            await asyncio.sleep(0)  # siblings woken by the same parent register first
            while self._waiting:
                wait = self._last + self.gap_s - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                self._last = time.perf_counter()
                heapq.heappop(self._waiting)[1].set_result(None)
                await asyncio.sleep(0)
        finally:
            self._busy = False


async def replay_real(w: Workload, backends: dict[str, Any], prompts: dict[str, str]
                      ) -> Outcome:
    from agentflow.llm.base import LLMRequest, SamplingParams

    out = Outcome()
    t0 = time.perf_counter()
    done: dict[str, asyncio.Event] = {c.id: asyncio.Event() for cs in w.calls for c in cs}
    trace_order = {c.id: k for k, c in enumerate(x for cs in w.calls for x in cs)}
    senders = {name: _Sender(w.send_gap_s) for name in backends}

    async def run_call(c: Call, arrival: float) -> None:
        await asyncio.sleep(max(0.0, arrival - (time.perf_counter() - t0)))
        for p in c.parents:
            await done[p].wait()
        out.submit[c.id] = time.perf_counter() - t0
        await senders[c.instance].turn(trace_order[c.id])
        request = LLMRequest(prompt=prompts[c.id], params=SamplingParams(
            max_tokens=c.output_tokens, temperature=0.0), stage="replay",
            query_id=f"q{c.query}")
        result = await backends[c.instance].generate(request)
        out.finish[c.id] = time.perf_counter() - t0
        out.prompt_tokens[c.id] = result.prompt_tokens
        out.engine_timings[c.id] = result.engine_timings
        out.split[c.id] = real_split(out.finish[c.id] - out.submit[c.id], result.ttft_s,
                                     result.engine_timings)
        if result.completion_tokens != c.output_tokens:
            raise RuntimeError(f"{c.id}: {result.completion_tokens} output tokens, asked for "
                               f"{c.output_tokens} (is ignore_eos reaching the server?)")
        done[c.id].set()

    cpu0 = {n: cpu_seconds(b) for n, b in backends.items()}
    quiet = Quietness()
    quiet.begin()

    async def sample_load() -> None:
        while True:
            await asyncio.sleep(5.0)
            quiet.sample()

    sampler = asyncio.ensure_future(sample_load())
    try:
        await asyncio.gather(*(run_call(c, w.arrivals[qi]) for qi, cs in enumerate(w.calls)
                               for c in cs))
    finally:
        sampler.cancel()
    out.wall_s = time.perf_counter() - t0
    used_now = {n: cpu_seconds(b) for n, b in backends.items()}
    engines = None if any(v is None for v in (*used_now.values(), *cpu0.values())) else \
        sum(used_now[n] - cpu0[n] for n in backends)  # type: ignore[operator]
    out.environment = quiet.end(engines)
    out.environment_line = quiet.line()
    for name, b in backends.items():
        used, start = cpu_seconds(b), cpu0[name]
        busy = busy_seconds([(out.submit[c.id], out.finish[c.id]) for cs in w.calls
                             for c in cs if c.instance == name])
        if used is not None and start is not None:
            out.engine_s[name] = used - start
            if busy > 0:
                out.cpu_share[name] = min(1.0, (used - start) / busy)
    return out


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``intervals``."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def calibrate(args: argparse.Namespace) -> None:
    cluster = load_cluster(args.cluster)
    name, cfg = cluster.expanded()[0]
    if args.refit:  # the rows of an earlier --calibrate --json, fitted again
        saved = json.loads(Path(args.refit).read_text())
        rows = [tuple(r) for r in saved["rows"]]
        batched = [tuple(r) for r in saved.get("batched", [])]
        joined = [tuple(r) for r in saved.get("joined", [])]
    else:
        rows, batched, joined = measure_calibration(args, name, cfg)
    model = engine_for(name, engine_limits(cfg)).model
    fit = fit_rows(hardware.gpu(cfg.gpu), model, engine_limits(cfg), rows, batched, joined,
                   cpu_share=args.cpu_share, fit_batched=args.fit_batched)
    fitted = fit.profile
    print("# fitted profile (paste into agentflow/hardware.py, or store it for this host "
          "with agentflow calibrate --cluster FILE):")
    print(", ".join(f"{f}={getattr(fitted, f):.4g}" for f in STORED_FIELDS))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": fit.rows, "batched": fit.batched,
                                               "joined": joined,
                                               "cpu_share": args.cpu_share, "fitted": {
            f: getattr(fitted, f) for f in STORED_FIELDS}}, indent=1))


# ------------------------------------------------------------------------------- report
def relative(sim: float, real: float) -> float:
    return abs(sim - real) / real


def report(w: Workload, real: Outcome, sim: Outcome, plot: Path | None,
           busy: dict[str, float]) -> dict[str, Any]:
    ids = [c.id for cs in w.calls for c in cs]
    r_call = np.array([real.call_latency(i) for i in ids])
    s_call = np.array([sim.call_latency(i) for i in ids])
    call_err = np.abs(s_call - r_call) / r_call
    r_q = np.array([real.query_latency(w, q) for q in range(len(w.calls))])
    s_q = np.array([sim.query_latency(w, q) for q in range(len(w.calls))])
    q_err = np.abs(s_q - r_q) / r_q
    print(f"{'query':>5} {'calls':>5} {'real_s':>8} {'sim_s':>8} {'sim/real':>8}")
    for q in range(len(w.calls)):
        print(f"{q:5d} {len(w.calls[q]):5d} {r_q[q]:8.2f} {s_q[q]:8.2f} {s_q[q] / r_q[q]:8.3f}")
    print(f"per call ({len(ids)}): median {np.median(call_err) * 100:.1f}%, "
          f"P90 {np.percentile(call_err, 90) * 100:.1f}%, sim/real of the sums "
          f"{s_call.sum() / r_call.sum():.3f}")
    print(f"per query ({len(r_q)}): median {np.median(q_err) * 100:.1f}%, "
          f"mean sim/real {np.mean(s_q / r_q):.3f}")
    for name, value in busy.items():
        print(f"{name}: mean busy slots per decode step (llama-server /metrics) {value:.2f}")
    if plot is not None:
        save_plot(plot, r_call, s_call, r_q, s_q)
        print(f"plot: {plot}")
    conc = in_flight_at_submit(real.submit, real.finish,
                               {c.id: c.instance for cs in w.calls for c in cs})
    table = breakdown(real.split, sim.split, conc)
    print_breakdown(table)
    print_worst_queries(w, real.submit, real.finish, real.split, sim)
    median_call = float(np.median(call_err))
    p95_query = float(np.percentile(q_err, 95))
    extra = call_figures(s_call, r_call, [c.output_tokens for cs in w.calls for c in cs])
    return {**extra, "median_call_error": median_call, "p95_query_error": p95_query,
            "call_real_s": r_call.tolist(), "call_sim_s": s_call.tolist(),
            "query_real_s": r_q.tolist(), "query_sim_s": s_q.tolist(), "busy_slots": busy,
            "call_submit_s": [real.submit[i] for i in ids],
            "call_instance": [c.instance for cs in w.calls for c in cs],
            "call_output_tokens": [c.output_tokens for cs in w.calls for c in cs],
            "call_finish_s": [real.finish[i] for i in ids],
            "attribution": table,
            "calls": per_call_records(ids, real.split, sim.split, conc, real.engine_timings)}


def resimulate(path: str, w: Workload, sim: Outcome, cluster_path: str, *,
               base: Outcome | None = None, pricing: str | None = None,
               references: dict[str, float] | None = None) -> None:
    """The saved real latencies (per call in workload order, per query) against ``sim``
    (the headline's replay; ``base``: the same priced at each instance's reference only,
    which the load-matched figure scales, default ``sim``; ``pricing``: what the headline
    is priced at; ``references``: today's store's, which the saved run's probes are taken
    over)."""
    saved = json.loads(Path(path).read_text())
    ids = [c.id for cs in w.calls for c in cs]
    r_call, r_q = np.asarray(saved["call_real_s"]), np.asarray(saved["query_real_s"])
    if len(r_call) != len(ids) or len(r_q) != len(w.calls):
        raise SystemExit(f"{path}: {len(r_call)} calls / {len(r_q)} queries saved, the "
                         f"workload has {len(ids)} / {len(w.calls)}")
    s_call = np.asarray([sim.call_latency(i) for i in ids])
    s_q = np.asarray([sim.query_latency(w, q) for q in range(len(w.calls))])
    call_err, q_err = np.abs(s_call - r_call) / r_call, np.abs(s_q - r_q) / r_q
    print(f"re-simulated against {path} (real side as measured then; its machine: "
          f"{saved.get('environment', 'not recorded')})")
    print(f"per call ({len(ids)}): median {np.median(call_err) * 100:.1f}%, sim/real of the "
          f"sums {s_call.sum() / r_call.sum():.3f}; per query: median "
          f"{np.median(q_err) * 100:.1f}%, mean sim/real {np.mean(s_q / r_q):.3f}")
    if "calls" in saved:
        real_splits = {c["id"]: Split(**c["real"]) for c in saved["calls"]}
        conc = {c["id"]: c["in_flight"] for c in saved["calls"]}
        print_breakdown(breakdown(real_splits, sim.split, conc))
    if "call_submit_s" in saved:  # runs saved since the lone-call figure
        real = Outcome(submit=dict(zip(ids, saved["call_submit_s"], strict=True)),
                       finish=dict(zip(ids, saved["call_finish_s"], strict=True)))
        if "calls" in saved:
            real.split = real_splits
            print_worst_queries(w, real.submit, real.finish, real.split, sim)
        lone_normalised(w, real, cluster_path)
    median, p95 = float(np.median(call_err)), float(np.percentile(q_err, 95))
    if "calibrate_first" in saved and "call_submit_s" in saved:
        rows = {n: [tuple(r) for r in v["rows"]]
                for n, v in saved["calibrate_first"]["instances"].items()}
        print(f"stored profile: median per call {median:.4f}, P95 per query {p95:.4f}")
        figures = calibrated_first(w, real, cluster_path, rows)["figures"]
        median, p95 = figures["median_call_error"], figures["p95_query_error"]
    if "engine_real_cpu_s" in saved:  # runs saved since the engine-work figure
        measured = Outcome(engine_s=saved["engine_real_cpu_s"])
        if "speed_probe" in saved:  # runs saved since the load-matched figure
            probes = saved["speed_probe"]
            factors = load_factors(probes["before"], probes["after"], references) \
                if references else probes["factor"]
            print(load_matched_line(load_matched((base or sim).engine_s, measured.engine_s,
                                                 factors), factors))
        print(engine_work_line(engine_work(measured, sim), pricing=pricing))
    print(f"median |sim-real|/real per call: {median:.4f}")
    print(f"P95 error per query: {p95:.4f}")


def calibrate_first_rows(backends: dict[str, Any], maker: PromptMaker, w: Workload,
                         cluster_path: str, repeats: int, loop: asyncio.AbstractEventLoop
                         ) -> dict[str, list[tuple]]:
    """``--calibrate-first``'s lone requests (``precalibrate.py``), run before the replay."""
    cluster = dict(load_cluster(cluster_path).expanded())
    calls = [c for cs in w.calls for c in cs]
    weights = []
    for c in calls:  # each call's time alone on its instance's stored profile
        limits = engine_limits(cluster[c.instance])
        weights.append(sim_single(hardware.gpu(limits.gpu), engine_for(c.instance, limits).model,
                                  limits, c.prompt_tokens, c.output_tokens)[1])
    shapes = workload_shapes([(c.prompt_tokens, c.output_tokens) for c in calls], weights)
    print(f"calibrate-first: lone requests of shapes {shapes} x {repeats} on every "
          "instance at once, before the replay")
    t = time.perf_counter()
    rows = loop.run_until_complete(measure_lone(backends, maker.make, shapes, repeats))
    print(f"calibrate-first: {sum(len(r) for r in rows.values())} requests in "
          f"{time.perf_counter() - t:.1f} s")
    return rows


def calibrated_first(w: Workload, real: Outcome, cluster_path: str,
                     rows: dict[str, list[tuple]]) -> dict[str, Any]:
    """The replay simulated again with each instance's profile fitted to its own
    ``--calibrate-first`` rows (speeds and per-request cost only; ``precalibrate.py``)."""
    cluster = dict(load_cluster(cluster_path).expanded())
    profiles: dict[str, hardware.GPUProfile] = {}
    out: dict[str, Any] = {"instances": {}}
    for name, inst_rows in rows.items():
        cfg = cluster[name]
        limits = engine_limits(cfg)
        model = engine_for(name, limits).model
        base = hardware.gpu(cfg.gpu)

        def simulate(g: hardware.GPUProfile, p: int, o: int) -> tuple[float, float]:
            return sim_single(g, model, limits, p, o)  # noqa: B023 (used in this loop)

        fitted, before, after = fit_speed(inst_rows, base, simulate)
        profiles[name] = fitted
        print(f"calibrate-first {name}: {describe(base, fitted)}; its rows' median |err| "
              f"{before * 100:.1f}% on the stored profile, {after * 100:.1f}% fitted")
        out["instances"][name] = {"rows": [list(r) for r in inst_rows],
                                  "fitted": {f: getattr(fitted, f) for f in FIT_FIELDS +
                                             ("peak_tflops", "mem_bw_gbs")},
                                  "rows_error_stored": before, "rows_error_fitted": after}
    sim = replay_sim(w, sim_engines(cluster_path, profiles))
    out["figures"] = error_figures(w, real, sim)
    out["call_sim_s"] = [sim.call_latency(c.id) for cs in w.calls for c in cs]
    out["query_sim_s"] = [sim.query_latency(w, q) for q in range(len(w.calls))]
    print(f"calibrate-first: median per call {out['figures']['median_call_error']:.4f}, "
          f"P95 per query {out['figures']['p95_query_error']:.4f}")
    if real.split:
        print_worst_queries(w, real.submit, real.finish, real.split, sim)
    return out


def lone_normalised(w: Workload, real: Outcome, cluster_path: str) -> dict[str, Any] | None:
    """The errors with each simulated engine slowed by the machine factor its lone calls
    showed during the replay (``normalise.py``: definition there); None without any."""
    ids = [c.id for cs in w.calls for c in cs]
    instance_of = {c.id: c.instance for cs in w.calls for c in cs}
    alone = lone_calls(real.submit, real.finish, instance_of)
    tokens = {c.id: (real.prompt_tokens.get(c.id, c.prompt_tokens), c.output_tokens)
              for cs in w.calls for c in cs}
    latency = {i: real.call_latency(i) for i in ids}
    factors = machine_factors(alone, instance_of, latency, tokens,
                              lambda name: sim_engines(cluster_path)[name])
    slow = instance_slowdowns(factors, sorted(set(instance_of.values())))
    if slow is None:
        print("lone-call-normalised: no call ran alone; no figure")
        return None
    for name, fs in sorted(factors.items()):
        fs = sorted(fs, key=lambda f: real.submit[f[0]])
        half = len(fs) // 2

        def ratio(part: list[tuple[str, float, float]]) -> float:
            return sum(r for _, r, _ in part) / sum(s for _, _, s in part)

        drift = (f"; first half of the run {ratio(fs[:half]):.3f}, second "
                 f"{ratio(fs[half:]):.3f}" if half else "")
        print(f"machine factor from lone calls, {name}: {slow[name]:.3f} over {len(fs)} "
              f"calls ({sum(r for _, r, _ in fs):.1f} s real){drift}")
    engines = sim_engines(cluster_path)
    for name, e in engines.items():  # (factors against these very engines: on top of them)
        e.slowdown *= slow[name]
    sim = replay_sim(w, engines)
    figures: dict[str, Any] = dict(error_figures(w, real, sim))
    shared = [i for i in ids if i not in alone]
    if shared:
        err = [relative(sim.call_latency(i), real.call_latency(i)) for i in shared]
        figures["median_call_error_shared"] = float(np.median(err))
    figures["slowdown"] = slow
    figures["lone_calls"] = len(alone)
    print(f"lone-call-normalised ({len(alone)} lone calls set the factor): median per call "
          f"{figures['median_call_error']:.4f} (calls that shared their server, "
          f"{len(shared)}: {figures.get('median_call_error_shared', float('nan')):.4f}), "
          f"P95 per query {figures['p95_query_error']:.4f}")
    return figures


def error_figures(w: Workload, real: Outcome, sim: Outcome) -> dict[str, float]:
    """``figures.call_figures`` of the calls and the P95 per query."""
    calls = [c for cs in w.calls for c in cs]
    query = [relative(sim.query_latency(w, q), real.query_latency(w, q))
             for q in range(len(w.calls))]
    return {**call_figures([sim.call_latency(c.id) for c in calls],
                           [real.call_latency(c.id) for c in calls],
                           [c.output_tokens for c in calls]),
            "p95_query_error": p95(query)}


def figures_line(f: dict[str, float]) -> str:
    """The per-call figures beside the headline median."""
    return (f"per call time-weighted {f['time_weighted_call_error']:.4f}, median over calls "
            f"of > 2 output tokens {f['median_call_error_gt2']:.4f}")


def save_plot(path: Path, r_call, s_call, r_q, s_q) -> None:
    from agentflow.plotting import finish_figure, plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    lo, hi = min(r_call.min(), s_call.min()), max(r_call.max(), s_call.max())
    ax1.plot([lo, hi], [lo, hi], color="grey", lw=1, label="sim = real")
    ax1.scatter(r_call, s_call, s=12, alpha=0.7, label="LLM call")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("real latency (s)")
    ax1.set_ylabel("simulated latency (s)")
    ax1.grid(alpha=0.3)
    ax1.legend()
    ax1.set_title("per call")
    x = np.arange(len(r_q))
    ax2.bar(x - 0.2, r_q, width=0.4, label="real")
    ax2.bar(x + 0.2, s_q, width=0.4, label="simulated")
    ax2.set_xlabel("query")
    ax2.set_ylabel("end-to-end latency (s)")
    finish_figure(fig, ax2, path, title="per query")


# --------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", help="cluster file (real backends + profiles); required "
                    "but with --repeat")
    ap.add_argument("--trace", help="HexGen-Flow JSON or agentflow JSONL trace")
    ap.add_argument("--rate", type=float, help="query arrivals per second (Poisson)")
    ap.add_argument("--quick", action="store_true", help="8 queries at --scale 0.1")
    ap.add_argument("--queries", type=int, help="queries to replay (default 30; --quick 8)")
    ap.add_argument("--skip", type=int, default=0, help="start at this query of the trace")
    ap.add_argument("--scale", type=float,
                    help="multiply every prompt/output length (default 1; --quick 0.1)")
    ap.add_argument("--max-prompt", type=int, help="cap on a call's prompt tokens (after scale)")
    ap.add_argument("--max-output", type=int, help="cap on a call's output tokens (after scale)")
    ap.add_argument("--tokenizer", help="for synthetic prompts: a .gguf file or a Hugging Face "
                    "tokenizer (default: the first llama_server instance's GGUF)")
    ap.add_argument("--assign", choices=("query", "call"), default="query")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--send-gap", type=float, default=SEND_GAP_S, metavar="S",
                    help="both sides send the calls ready for an instance in trace order, "
                    f"this many seconds apart (default {SEND_GAP_S})")
    ap.add_argument("--plot", default="real_vs_sim.png", help="where to save the plot")
    ap.add_argument("--json", help="also write the numbers to this file")
    ap.add_argument("--resim", metavar="JSON",
                    help="no real engines: the current simulator against the real side of "
                    "an earlier run's --json (same workload); checks a simulator change "
                    "on measurements already taken")
    ap.add_argument("--repeat", nargs="+", metavar="JSON",
                    help="no engines: two or more earlier runs' --json files of one workload "
                    "against each other (the real side's own repeat error, speed-matched, "
                    "and the sqrt(2) floor it puts under the simulator's; fidelity/repeat.py)")
    ap.add_argument("--no-probe", dest="probe", action="store_false",
                    help="skip the single-request probes before and after the replay")
    ap.add_argument("--no-speed-probe", dest="speed_probe", action="store_false",
                    help="skip the speed probe before and after the replay (a fixed request "
                    "set on each server's CPU clock, against what it cost when agentflow "
                    "calibrate stored the host profile; it gives the load-matched engine "
                    "work figure)")
    ap.add_argument("--calibrate", action="store_true",
                    help="fit the hardware profile from single requests instead")
    ap.add_argument("--repeats", type=int, default=2,
                    help="--calibrate / --calibrate-first: rounds of the grid")
    ap.add_argument("--calibrate-first", action="store_true",
                    help="before the replay, time a few lone requests of the workload's "
                    "shapes on every instance and fit each one's compute speed, memory speed "
                    "and per-request cost on top of its profile (precalibrate.py); the "
                    "replay is then simulated on both, the stored profile's figures are "
                    "printed too, and the last two lines are the calibrated ones")
    ap.add_argument("--refit", metavar="JSON",
                    help="--calibrate: fit the rows an earlier --calibrate --json saved")
    ap.add_argument("--cpu-share", action="store_true",
                    help="--calibrate: fit dedicated-core times (each row's times x the "
                    "share of its core the server process got, from /proc)")
    ap.add_argument("--fit-batched", action="store_true",
                    help="--calibrate: fit on the batched-decode rows too (default: they "
                    "only check the single-request fit)")
    args = ap.parse_args(argv)
    if args.repeat:
        try:
            repeat.report(args.repeat, args.json)
        except ValueError as exc:
            ap.error(str(exc))
        return
    if not args.cluster:
        ap.error("--cluster is required (unless --repeat)")
    if args.resim:  # the workload is the saved run's own
        saved_args = json.loads(Path(args.resim).read_text())["args"]
        for key in ("trace", "rate", "quick", "queries", "skip", "scale", "max_prompt",
                    "max_output", "assign", "seed"):
            setattr(args, key, saved_args[key])
        # runs saved before the real side spaced its sends: the simulator's 2 ms then
        args.send_gap = saved_args.get("send_gap", OLD_SEND_GAP_S)
    if args.calibrate:
        calibrate(args)
        return
    if not args.trace or args.rate is None:
        ap.error("--trace and --rate are required (unless --calibrate)")
    n = args.queries or (8 if args.quick else 30)
    scale = args.scale if args.scale is not None else (0.1 if args.quick else 1.0)
    if not 0 < scale <= 1 or n < 1:
        ap.error("--scale must be in (0, 1] and --queries >= 1")
    queries = load_trace(args.trace)[args.skip:args.skip + n]
    engines = sim_engines(args.cluster)
    w = build_workload(queries, list(engines), rate=args.rate, seed=args.seed, scale=scale,
                       max_prompt=args.max_prompt, max_output=args.max_output,
                       assign=args.assign, send_gap_s=args.send_gap)
    n_calls = sum(len(c) for c in w.calls)
    print(f"# {len(queries)} queries ({n_calls} LLM calls) of {args.trace} at {args.rate}/s, "
          f"tokens x{scale} (caps: prompt {args.max_prompt}, output {args.max_output}), "
          f"assign by {args.assign}, instances {', '.join(engines)}")
    sources = profile_sources(args.cluster)
    for name, e in engines.items():
        print(f"  sim {name}: {e.gpu.name} / {e.model.name}, max_num_seqs {e.max_num_seqs}, "
              f"token budget {e.max_num_batched_tokens}; {sources[name]}")
    sim = replay_sim(w, engines)
    print(f"simulated in {sim.wall_s:.2f} s wall")
    if args.resim:
        saved = json.loads(Path(args.resim).read_text())
        measured = Outcome(engine_s=saved.get("engine_real_cpu_s", {}))
        references = speed_references(args.cluster)
        before = (saved.get("speed_probe") or {}).get("before", {})
        factors = predicted_factors(before, references)
        base = sim
        if factors:
            sim = replay_sim(w, priced_engines(args.cluster, factors))
        corun_replay(w, args.cluster, saved.get("environment") or {}, sim, measured, factors)
        resimulate(args.resim, w, sim, args.cluster, base=base,
                   pricing=pricing_note(factors, instance_priced(engines)),
                   references=references)
        return
    backends = start_backends(args.cluster)
    loop = asyncio.new_event_loop()
    try:
        maker = PromptMaker(tokenizer_of(backends, args.tokenizer), args.seed)
        prompts = {c.id: maker.make(c.prompt_tokens) for cs in w.calls for c in cs}

        def fresh(name: str) -> SimInstance:
            return sim_engines(args.cluster)[name]

        probes = {}
        speed: dict[str, dict[str, float]] = {}
        references = speed_references(args.cluster) if args.speed_probe else {}
        if args.probe:
            probes["before"] = loop.run_until_complete(probe(backends, maker.make, fresh))
        if references:
            speed["before"] = loop.run_until_complete(speed_probes(backends, maker.make))
        first_rows = calibrate_first_rows(backends, maker, w, args.cluster, args.repeats,
                                          loop) \
            if args.calibrate_first else None
        real = loop.run_until_complete(replay_real(w, backends, prompts))
        busy = {name: b.metrics().get("n_busy_slots_per_decode", float("nan"))
                for name, b in backends.items() if hasattr(b, "metrics")}
        if references:
            speed["after"] = loop.run_until_complete(speed_probes(backends, maker.make))
        if args.probe:
            probes["after"] = loop.run_until_complete(probe(backends, maker.make, fresh))
        maker.close()
    finally:
        loop.run_until_complete(close_all(backends))
        close_loop(loop)
    off = [abs(real.prompt_tokens[c.id] - c.prompt_tokens) for cs in w.calls for c in cs]
    print(f"real replay: {real.wall_s:.1f} s wall; prompt tokens as served vs planned: "
          f"mean |diff| {np.mean(off):.2f}, max {max(off)}")
    # The headline's pricing, all from before the real side ran: each instance's typical
    # calibration speed (its engine's own pricing: ``sim``) and the speed probe just before
    base = sim
    factors = predicted_factors(speed.get("before", {}), references)
    pricing = pricing_note(factors, instance_priced(engines))
    if factors:
        sim = replay_sim(w, priced_engines(args.cluster, factors))
    corun = corun_replay(w, args.cluster, real.environment, sim, real, factors)
    result = report(w, real, sim, Path(args.plot) if args.plot else None, busy)
    result["engine_work_pricing"] = {"note": pricing, "factors": factors,
                                     "references": references,
                                     "before_weight": BEFORE_WEIGHT if factors else 0.0}
    if corun:
        result["corun"] = corun
    print(real.environment_line)
    result["environment"] = real.environment
    work = engine_work(real, sim)
    result["engine_work"] = work
    result["engine_real_cpu_s"] = real.engine_s
    result["engine_sim_busy_s"] = sim.engine_s
    if any(v.startswith("host profile") for v in sources.values()):
        stored = replay_sim(w, stored_engines(args.cluster))
        result["engine_work_stored"] = engine_work(real, stored)
        print(engine_work_line(result["engine_work_stored"], "stored profile"))
    if speed:
        # (priced at the probes around the replay, so not predictive: a diagnosis)
        around = load_factors(speed["before"], speed["after"], references)
        result["speed_probe"] = {**speed, "reference": references, "factor": around}
        result["engine_work_load_matched"] = load_matched(base.engine_s, real.engine_s, around)
        print(load_matched_line(result["engine_work_load_matched"], around))

    def save() -> None:
        # Written as soon as the replay is in hand, then again with each later figure: an
        # optional step that fails (a fit, a missing dependency) cannot lose the replay.
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), **result}, indent=1))

    save()
    if probes:
        # Not fitted to the replay: single requests before and after it say how fast each
        # engine was against its profile; the simulated replay with each core slowed by the
        # mean of the two shows what is left once the machine's speed at the time is out.
        print("single-request probes, real/sim (before, after the replay): " + ", ".join(
            f"{n} {probes['before'][n]:.3f} / {probes['after'][n]:.3f}" for n in engines))
        slowed = sim_engines(args.cluster)
        for name, e in slowed.items():  # (real/sim on these very engines: on top of them)
            e.slowdown *= (probes["before"][name] + probes["after"][name]) / 2
        corrected = error_figures(w, real, replay_sim(w, slowed))
        result["probes"] = probes
        result["probe_corrected"] = corrected
        print(f"probe-corrected: median per call {corrected['median_call_error']:.4f}, "
              f"P95 per query {corrected['p95_query_error']:.4f}")
    if real.cpu_share:
        # The same replay with each simulated core slowed to the share of its core the
        # real server got (measured by the OS, not fitted): what the engine physics gets
        # wrong once contention from other processes is taken out.
        print("share of its core each server got while busy: " + ", ".join(
            f"{n} {v:.2f}" for n, v in real.cpu_share.items()))
        shared = sim_engines(args.cluster)
        for name, e in shared.items():
            e.slowdown *= 1.0 / real.cpu_share.get(name, 1.0)
        slowed = replay_sim(w, shared, background=background_share(real.environment))
        corrected = error_figures(w, real, slowed)
        result["cpu_share"] = real.cpu_share
        result["share_corrected"] = corrected
        print(f"share-corrected: median per call {corrected['median_call_error']:.4f}, "
              f"P95 per query {corrected['p95_query_error']:.4f}")
        # Its engine work, busy seconds taken back to a dedicated core's: a core slowed to
        # a fifth of its speed holds each call five times as long, so more calls share its
        # passes (simulated at the quick replays' shapes: 2-5% less work at 1/5 speed). So
        # on a loaded machine the real servers batch more than the full-speed simulator
        # does; this figure compares the two at the overlap the real side had.
        result["engine_work_share_slowed"] = {
            n: slowed.engine_s[n] * real.cpu_share.get(n, 1.0) / real.engine_s[n]
            for n in slowed.engine_s if real.engine_s.get(n)}
        print(engine_work_line(result["engine_work_share_slowed"], "share-slowed replay"))
    normalised = lone_normalised(w, real, args.cluster)
    if normalised is not None:
        result["lone_normalised"] = normalised
    median, p95_q = result["median_call_error"], result["p95_query_error"]
    headline: dict[str, Any] = result
    if first_rows is not None:
        result["calibrate_first"] = calibrated_first(w, real, args.cluster, first_rows)
        print(f"stored profile: median per call {median:.4f}, P95 per query {p95_q:.4f}; "
              + figures_line(result))
        headline = result["calibrate_first"]["figures"]
        median, p95_q = headline["median_call_error"], headline["p95_query_error"]
    save()
    print(figures_line(headline))
    print(engine_work_line(work, pricing=pricing))
    print(f"median |sim-real|/real per call: {median:.4f}")
    print(f"P95 error per query: {p95_q:.4f}")


if __name__ == "__main__":
    main()
