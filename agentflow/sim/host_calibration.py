"""Time this host's local engines and fit a hardware profile on what they did.

    agentflow calibrate --cluster FILE            # stores the fit for this host
    agentflow bench real_vs_sim --cluster FILE --calibrate   # prints it

Why a module of its own: ``agentflow calibrate`` is a product command (a fresh machine's
first step before the simulator prices its local llama-server instances) and
``real_vs_sim --calibrate`` is a benchmark; both take the same measurements and the same fit,
so they live here, below both, and the command never imports a benchmark.

What it measures on one instance, as serving starts it (``create_backend``, end of text
ignored so the engine does exactly the asked work): single requests over a grid of prompt and
output lengths, timed as the caller sees them (submit to first token, submit to last token);
batches of equal requests, each between two lone requests of the same minute (batch/lone
ratios, so a machine's drift cancels); and a decode that a newcomer's prompt joins. Every row
is timed on the server's own CPU clock (``ServerClock``: the server process's CPU seconds,
per thread from /proc to the nanosecond, read at submit, first token and last token), which
other work on the machine does not stretch, so a calibration on a busy machine fits what a
dedicated core does (``--wall-clock``: the earlier way, wall times scaled by the share of
its core the server got over each row). Prompts are synthetic (``PromptMaker``: random
common words of an exact token count, different for every call, so no prompt cache helps).

What it fits: the profile's efficiencies and overheads (``FIT_FIELDS``) on top of a base
profile, by least squares of the simulator's own single-request (and, with ``fit_batched``,
batched) times, relative error; on wall-clock rows, ``cpu_share`` fits the seconds a
dedicated core would have taken. Every check it prints compares the simulator with the rows
before and after the fit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from agentflow import hardware
from agentflow.config import InstanceConfig
from agentflow.event_loop import close_loop
from agentflow.sim.cluster import load_cluster
from agentflow.sim.engine import SimInstance

_WORDS = ("time year people way day man thing woman life child world school state family "
          "student group country problem hand part place case week company system program "
          "question work government number night point home water room mother area money "
          "story fact month lot right study book eye job word business issue side kind head "
          "house service friend father power hour game line end member law car city name "
          "team minute idea kid body information back parent face others level office door "
          "health person art war history party result change morning reason research girl "
          "guy moment air teacher force education").split()

def engine_limits(cfg: InstanceConfig) -> InstanceConfig:
    """llama-server's slots and batch are its engine's max_num_seqs / token budget."""
    backend = cfg.backend
    if backend.get("type") == "llama_server":
        from agentflow.llm.llamacpp_server import LlamaServerSpec

        spec = LlamaServerSpec.model_validate(backend)
        return cfg.model_copy(update={"max_num_seqs": spec.parallel,
                                      "max_num_batched_tokens": spec.batch})
    return cfg



class PromptMaker:
    """Prompts of an exact token count in the served model's tokenizer: random common words,
    cut to n - 1 tokens (the server adds BOS), different for every call. ``tokenizer``: a
    GGUF file (llama.cpp, vocabulary only) or a Hugging Face tokenizer name or folder (vLLM
    servers; needs ``transformers``)."""

    def __init__(self, tokenizer: str, seed: int):
        self._rng = np.random.default_rng(seed)
        self._llm: Any = None
        self._hf: Any = None
        if tokenizer.endswith(".gguf"):
            from llama_cpp import Llama

            self._llm = Llama(tokenizer, vocab_only=True, verbose=False)
        else:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise SystemExit(f"--tokenizer {tokenizer}: a Hugging Face tokenizer needs "
                                 "'transformers' (or pass a .gguf file)") from None
            self._hf = AutoTokenizer.from_pretrained(tokenizer)

    def make(self, n_tokens: int) -> str:
        want = max(0, n_tokens - 1)
        text = " ".join(self._rng.choice(_WORDS, size=want + 8))
        if self._llm is not None:
            tokens = self._llm.tokenize(text.encode(), add_bos=False)
            return self._llm.detokenize(tokens[:want]).decode("utf-8", "replace")
        ids = self._hf(text, add_special_tokens=False)["input_ids"][:want]
        return self._hf.decode(ids)

    def close(self) -> None:
        if self._llm is not None:
            self._llm.close()



def cpu_seconds(backend: Any) -> float | None:
    """CPU seconds the backend's server process has used, where it can say."""
    read = getattr(backend, "cpu_seconds", None)
    return read() if read is not None else None


def server_pid(backend: Any) -> int | None:
    """The process id of a local backend's server (llama-server), else None."""
    pid = getattr(getattr(backend, "process", None), "pid", None)
    return pid if isinstance(pid, int) else None


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds of every live thread of process ``pid``, to the nanosecond: the sum of
    ``/proc/<pid>/task/<tid>/schedstat``'s first field (time spent on a CPU). ``/proc/<pid>/
    stat`` counts in clock ticks (10 ms), as long as a short calibration row; llama-server's
    threads (the inference loop, the HTTP pool) live as long as the server. None where the
    kernel keeps no schedstat (or the process is gone)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:  # a thread that just exited
                continue
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


class ServerClock:
    """Time as the server's own CPU spends it, or the wall clock where that cannot be read.

    Why: on a core shared with other work a request's wall time is its CPU time stretched by
    the share of the core the server got, and that share moves from one second to the next
    (25% on a busy machine, 100% on a quiet one). The server's CPU seconds are what a
    dedicated core would take, whatever else runs beside it, so every calibration row is
    timed on this clock: each interval is the server's CPU seconds between its two ends
    (``now`` read at submit, at the first streamed token, at the last). A remote server (an
    ``openai`` backend) has no CPU clock here: its rows are wall times (``cpu`` False)."""

    def __init__(self, backend: Any, *, use_cpu: bool = True):
        pid = server_pid(backend) if use_cpu else None
        self._pid = pid if pid is not None and process_cpu_s(pid) is not None else None

    @property
    def cpu(self) -> bool:
        return self._pid is not None

    def now(self) -> float:
        if self._pid is not None:
            got = process_cpu_s(self._pid)
            if got is not None:
                return got
            raise RuntimeError(f"server process {self._pid} is gone: its CPU clock stopped")
        return time.perf_counter()



def start_backends(cluster_path: str) -> dict[str, Any]:
    """The cluster's instances as serving starts them, with end of text ignored."""
    from agentflow.llm.registry import create_backend

    cluster = load_cluster(cluster_path)
    backends = {}
    try:
        for name, cfg in cluster.expanded():
            spec = dict(cfg.backend)
            if spec.get("type") == "llama_server":
                spec.update(ignore_eos=True, name=name)
            elif spec.get("type") == "openai":
                spec["extra_body"] = {**spec.get("extra_body", {}), "ignore_eos": True}
            backends[name] = create_backend(spec)
    except BaseException:
        asyncio.run(close_all(backends))
        raise
    return backends


async def close_all(backends: dict[str, Any]) -> None:
    for b in backends.values():
        await b.close()


def tokenizer_of(backends: dict[str, Any], given: str | None) -> str:
    if given:
        return given
    for b in backends.values():
        path = getattr(b, "model_path", None)
        if path:
            return str(path)
    raise SystemExit("synthetic prompts need the served model's tokenizer: no instance runs a "
                     "GGUF file, so pass --tokenizer (a Hugging Face name/folder or a .gguf)")




# --------------------------------------------------------------------------- speed probe
# A fixed piece of work timed on the server's CPU clock: ``agentflow calibrate`` stores its
# CPU seconds with the fit (``HostProfile.speed_probe_cpu_s``) and ``real_vs_sim`` times it
# again right before and right after a replay. Why: the CPU clock takes out the time a
# server waits for its core, but not what co-running processes do to the work itself (they
# stream memory and evict the weights from the shared caches: on this project's 2-core VM
# a 2,048-token prompt cost 19-80% more CPU seconds beside two other busy servers), so the
# replay's CPU seconds per unit of work are the calibration's times this ratio. (prompt,
# output) requests, one after another: a prompt, a decode, and a bit of both.
SPEED_PROBE = ((512, 1), (32, 32), (256, 8))


async def speed_probe(backend: Any, make_prompt: Any) -> float | None:
    """CPU seconds the server spends on ``SPEED_PROBE``'s requests (``make_prompt(n)``: a
    prompt of n tokens); None where its CPU clock cannot be read (a remote server)."""
    from agentflow.llm.base import LLMRequest, SamplingParams

    clock = ServerClock(backend)
    if not clock.cpu:
        return None
    total = 0.0
    for p, o in SPEED_PROBE:
        request = LLMRequest(prompt=make_prompt(p), params=SamplingParams(
            max_tokens=o, temperature=0.0), stage="speed-probe")
        c0 = clock.now()
        await backend.generate(request)
        total += clock.now() - c0
    return total


# The probe's runs within one calibration should agree: at idle on this project's VM they
# span 2% (4.24-4.32 CPU-s), but in one calibration 29% (4.71-6.07) while the replays after
# it took 1.29-1.41x the CPU seconds of the same replays on a quiet host. A fit over rows
# timed at moving speeds is a fit of no one speed, so ``calibrate`` says so.
PROBE_SPREAD_LIMIT = 1.10


def probe_spread_warning(probes: Sequence[float], limit: float = PROBE_SPREAD_LIMIT) -> str | None:
    """A warning when the speed probe's runs (CPU-s) span more than ``limit`` (max/min),
    else None."""
    if len(probes) < 2:
        return None
    if min(probes) <= 0:
        raise ValueError(f"speed probe CPU seconds must be positive: {list(probes)}")
    spread = max(probes) / min(probes)
    if spread <= limit:
        return None
    return (f"WARNING: the speed probe moved {(spread - 1) * 100:.0f}% within this calibration "
            f"({min(probes):.3f}-{max(probes):.3f} CPU-s, limit {(limit - 1) * 100:.0f}%): the "
            "machine's speed changed while the rows were timed (another VM on the host's "
            "cores, or other processes), so the fit mixes speeds; calibrate again when the "
            "machine is quiet, or read replays' load-matched engine work")


# --------------------------------------------------------------------------- calibration
CAL_PROMPTS = (32, 256, 1024, 2048)
CAL_OUTPUTS = (1, 24, 96)
# Batched decode: B requests of one shape submitted together. Single requests cannot tell a
# per-step cost from a per-sequence one (every step has one sequence), and on a CPU core
# the per-sequence decode compute is what grows a batch's step (agentflow.step_time).
CAL_BATCHES = (2, 4)
CAL_BATCH_SHAPES = ((32, 64), (512, 64))


def fresh_slots(n_slots: int, batch: int) -> list[int]:
    """The slots a fresh llama-server gives ``batch`` requests arriving together, in order:
    what the simulator's engine of a calibration row gives them (``SlotTable.take``)."""
    from agentflow.llm.llama_batches import SlotTable

    table = SlotTable(n_slots)
    return [table.take(f"x{i}") for i in range(batch)]


class SlotClients:
    """Batched and joined calibration rows with each request pinned to the slot the
    simulator's fresh engine gives it (``fresh_slots``; a llama-server's ``pinned``
    clients), so the batch lands in the same ubatches on both sides whatever requests came
    before (llama-server gives a request the idle slot released longest ago, which after a
    lone request is often not next to the other idle one; on the Sapphire Rapids build host
    two decodes in slots 0 and 2 cost 1.94-2.11x a lone step, in 0 and 1 1.25-1.37x).
    A backend without slots to pin (a remote server) serves every request itself."""

    def __init__(self, backend: Any):
        self._backend = backend
        self._n = int(getattr(backend, "slots", 0) or 0)
        self._pinned: dict[int, Any] = {}
        self.pins = callable(getattr(backend, "pinned", None)) and self._n > 0

    def for_batch(self, batch: int) -> list[Any]:
        if not self.pins:
            return [self._backend] * batch
        out = []
        for slot in fresh_slots(self._n, batch):
            if slot not in self._pinned:
                self._pinned[slot] = self._backend.pinned(slot)
            out.append(self._pinned[slot])
        return out

    async def close(self) -> None:
        for client in self._pinned.values():
            await client.close()
        self._pinned.clear()


async def measure_single(backend: Any, maker: PromptMaker, repeats: int, *,
                         cpu_clock: bool = True, tag: str = "") -> list[tuple]:
    """(prompt, output, ttft_s, total_s, share, wall ttft_s, wall total_s) of one-at-a-time
    requests. On the server's CPU clock (``ServerClock``; ``share`` is then 1.0: the times
    are already a dedicated core's) where it can be read, else as the caller sees them
    (perf_counter around the HTTP call, the first token's time from the stream; ``share``:
    the server's CPU seconds over the wall time, from /proc, 1.0 where unknown). The last
    two columns are always the wall times."""
    from agentflow.llm.base import LLMRequest, SamplingParams

    rows = []
    clock = ServerClock(backend, use_cpu=cpu_clock)

    async def one(p: int, o: int) -> tuple:
        req = LLMRequest(prompt=maker.make(p), params=SamplingParams(max_tokens=o))
        first: list[float] = []

        def progress(_: int) -> None:
            if not first:
                first.append(clock.now())

        c0, s0 = clock.now(), cpu_seconds(backend)
        t = time.perf_counter()
        res = await backend.generate(req, on_progress=progress)
        elapsed = time.perf_counter() - t
        c1, s1 = clock.now(), cpu_seconds(backend)
        if clock.cpu:
            total = c1 - c0
            ttft = first[0] - c0 if first else total * res.ttft_s / elapsed
            return (res.prompt_tokens, o, ttft, total, 1.0, res.ttft_s, elapsed)
        share = min(1.0, (s1 - s0) / elapsed) if s0 is not None and s1 is not None else 1.0
        return (res.prompt_tokens, o, res.ttft_s, elapsed, share, res.ttft_s, elapsed)

    async def all_rows() -> None:
        await one(16, 2)  # warm-up
        for _ in range(repeats):
            for p in CAL_PROMPTS:
                for o in CAL_OUTPUTS:
                    rows.append(await one(p, o))
                    r = rows[-1]
                    what = "server CPU" if clock.cpu else f"wall, core share {r[4]:.2f}"
                    print(f"{tag}  prompt {r[0]:5d} output {o:4d}: ttft {r[2]:.3f} s total "
                          f"{r[3]:.3f} s ({what}; wall {r[5]:.3f} / {r[6]:.3f} s, share "
                          f"{r[3] / r[6]:.2f})", flush=True)

    await all_rows()
    return rows


async def measure_batched(backend: Any, maker: PromptMaker, repeats: int, *,
                          cpu_clock: bool = True, tag: str = "") -> list[tuple]:
    """(batch, prompt, output, mean total_s, core share, lone total_s, lone core share) of
    ``batch`` equal requests sent at once, each batch between two lone requests of the same
    shape on the same server (their mean is the lone time). The VM's speed drifts 1.0-1.4x
    within an hour, which a batch row alone cannot tell from batching physics; its ratio to
    lone requests taken in the same minute can, since the machine factor cancels. Times on
    the server's CPU clock where it can be read (``ServerClock``; shares 1.0), else wall
    times with the server's share of its core."""
    from agentflow.llm.base import LLMRequest, SamplingParams

    rows = []
    clock = ServerClock(backend, use_cpu=cpu_clock)
    slots = SlotClients(backend)

    async def one(p: int, o: int, start: float, client: Any) -> tuple[int, float, float]:
        req = LLMRequest(prompt=maker.make(p), params=SamplingParams(max_tokens=o))
        res = await client.generate(req)
        per_tok = (res.engine_timings or {}).get("predicted_per_token_ms", float("nan"))
        return res.prompt_tokens, clock.now() - start, float(per_tok)

    async def timed(b: int, p: int, o: int) -> tuple[list, float, float]:
        clients = slots.for_batch(b)
        c0, t, start = cpu_seconds(backend), time.perf_counter(), clock.now()
        got = await asyncio.gather(*(one(p, o, start, c) for c in clients))
        elapsed, c1 = time.perf_counter() - t, cpu_seconds(backend)
        share = min(1.0, (c1 - c0) / elapsed) if c0 is not None and c1 is not None else 1.0
        return got, float(np.mean([g[1] for g in got])), 1.0 if clock.cpu else share

    async def all_rows() -> None:
        for _ in range(repeats):
            for b in CAL_BATCHES:
                for p, o in CAL_BATCH_SHAPES:
                    before, t_before, s_before = await timed(1, p, o)
                    got, total, share = await timed(b, p, o)
                    after, t_after, s_after = await timed(1, p, o)
                    served = round(float(np.mean([g[0] for g in got])))
                    lone = (t_before + t_after) / 2
                    rows.append((b, served, o, total, share, lone, (s_before + s_after) / 2))
                    lone_tok = (before[0][2] + after[0][2]) / 2
                    batch_tok = float(np.mean([g[2] for g in got]))
                    print(f"{tag}  batch {b} x prompt {served:5d} output {o:4d}: mean total "
                          f"{total:.3f} s (lone, same minute: {lone:.3f} s; ratio "
                          f"{total / lone:.3f}; {'server CPU' if clock.cpu else 'wall'}); "
                          f"decode ms/token (wall) {batch_tok:.1f} vs lone {lone_tok:.1f} "
                          f"({batch_tok / lone_tok:.3f})", flush=True)

    try:
        await all_rows()
    finally:
        await slots.close()
    return rows


# A decode that a newcomer's prompt joins: request A (short prompt, ``CAL_JOIN_OUTPUT``
# tokens) is decoding when B's prompt arrives ``CAL_JOIN_DELAY_S`` later; llama-server then
# runs A's decode tokens inside B's prompt batches (and its checkpoint breaks). Batched
# decode rows alone never put a decode beside a prompt chunk, the replay does all the time.
CAL_JOIN_PROMPTS = (512, 1024)
CAL_JOIN_OUTPUT = 64
CAL_JOIN_DELAY_S = 1.0


async def measure_joined(backend: Any, maker: PromptMaker, repeats: int, *,
                         cpu_clock: bool = True, tag: str = "") -> list[tuple]:
    """(B's prompt, A's total_s joined, A's total_s alone, B's total_s joined, B's alone,
    B's arrival after A): A alone, then A joined by B, then B alone, each lone time from the
    same minute. On the server's CPU clock where it can be read (B is sent
    ``CAL_JOIN_DELAY_S`` of wall time after A; the last column is that delay on the clock
    the row uses)."""
    from agentflow.llm.base import LLMRequest, SamplingParams

    rows = []
    clock = ServerClock(backend, use_cpu=cpu_clock)
    slots = SlotClients(backend)

    async def one(p: int, o: int, delay: float = 0.0, client: Any = None
                  ) -> tuple[int, float, float]:
        await asyncio.sleep(delay)
        req = LLMRequest(prompt=maker.make(p), params=SamplingParams(max_tokens=o))
        t = clock.now()
        res = await (client or slots.for_batch(1)[0]).generate(req)
        return res.prompt_tokens, clock.now() - t, t

    async def all_rows() -> None:
        for _ in range(repeats):
            for pb in CAL_JOIN_PROMPTS:
                _, a_lone, _ = await one(32, CAL_JOIN_OUTPUT)
                pair = slots.for_batch(2)
                (pa, a_join, a_t), (served, b_join, b_t) = await asyncio.gather(
                    one(32, CAL_JOIN_OUTPUT, client=pair[0]),
                    one(pb, 4, CAL_JOIN_DELAY_S, client=pair[1]))
                _, b_lone, _ = await one(pb, 4)
                rows.append((served, a_join, a_lone, b_join, b_lone, b_t - a_t))
                print(f"{tag}  decode of {CAL_JOIN_OUTPUT} joined after {b_t - a_t:.3f} s by a "
                      f"{served}-token prompt: A {a_join:.3f} s (alone {a_lone:.3f} s, ratio "
                      f"{a_join / a_lone:.3f}), B {b_join:.3f} s (alone {b_lone:.3f} s, "
                      f"ratio {b_join / b_lone:.3f}; "
                      f"{'server CPU' if clock.cpu else 'wall'})", flush=True)

    try:
        await all_rows()
    finally:
        await slots.close()
    return rows


def sim_joined(gpu: hardware.GPUProfile, model: hardware.ModelProfile, limits: InstanceConfig,
               prompt_b: int, delay: float = CAL_JOIN_DELAY_S) -> tuple[float, float]:
    """Simulated (A's latency, B's latency) of a ``measure_joined`` row, B arriving
    ``delay`` s after A."""
    eng = SimInstance(gpu, model, max_num_seqs=limits.max_num_seqs,
                      max_num_batched_tokens=limits.max_num_batched_tokens,
                      use_calibration=False)
    if limits.backend.get("type") == "llama_server":
        from agentflow.llm.llamacpp_server import configure_engine

        configure_engine(eng, limits.backend, model)
    eng.add("a", 32, CAL_JOIN_OUTPUT, 0, 0.0)
    ends: dict[str, float] = {}
    added = False
    while True:
        t = eng.next_event_time()
        if not added and (t is None or t >= delay):
            ends.update((ev.seq_id, ev.time) for ev in eng.step_until(delay)
                        if ev.kind == "finished")
            eng.add("b", prompt_b, 4, 0, delay)
            added = True
            continue
        if t is None:
            break
        for ev in eng.step_until(t):
            if ev.kind == "finished":
                ends[ev.seq_id] = ev.time
    return ends["a"], ends["b"] - delay


def print_joined_check(label: str, g: hardware.GPUProfile, model: hardware.ModelProfile,
                       limits: InstanceConfig, joined: list[tuple]) -> None:
    """Joined/lone ratios, simulated vs real, of A (the decode) and B (the prompt)."""
    cells = []
    for row in joined:
        pb, a_join, a_lone, b_join, b_lone = row[:5]
        sa, sb = sim_joined(g, model, limits, pb, *row[5:6])
        la, lb = sim_single(g, model, limits, 32, CAL_JOIN_OUTPUT)[1], \
            sim_single(g, model, limits, pb, 4)[1]
        cells.append(f"p{pb}: A {sa / la:.3f} vs {a_join / a_lone:.3f}, B {sb / lb:.3f} vs "
                     f"{b_join / b_lone:.3f}")
    print(f"{label}: decode joined by a prompt, joined/lone ratio sim vs real: "
          + "; ".join(cells))


# The profile's efficiencies and overheads that single requests identify (prefill compute,
# weight streaming, KV reads, per step, per request); an operator-level engine's prefill
# attention efficiency too, where the profile has one.
FIT_FIELDS = tuple(f for f in ("compute_efficiency", "decode_compute_efficiency",
                               "bw_efficiency", "attn_bw_efficiency",
                               "prefill_attn_efficiency", "step_overhead_s",
                               "request_overhead_s")
                   if f in hardware.GPUProfile.__dataclass_fields__)
# Bounds of the fitted fractions. Compute ones may pass 1 (the profile's peak is fp32 FMA,
# and llama.cpp's quantised dot products run on int8 VNNI). Bandwidth ones are fractions of
# the base profile's nominal per-core bandwidth (Xeon-core: 12 GB/s, a Sapphire Rapids
# core's), which another host's core can beat: on this project's AMD EPYC VM a fit bounded
# at 1 sat at the bound for both bandwidths, put the lost decode time into the per-step
# read and priced batches 27-31% short (batch/lone ratios); bounded at 4 (48 GB/s, what one
# core can stream at most) it read 1.8x, and the batched rows' median error fell from 18% to
# 9%, the fit's max from 31% to 18% (same rows). KV reads of short contexts come from the
# caches, so that fraction can reach the bound.
_UPPER = {"bw_efficiency": 4.0, "attn_bw_efficiency": 4.0}
# ``GPUProfile.cpu_tiled_rows`` is discrete: each is fitted and the one whose batched rows
# fit best is kept (0: a pass's rows share one weight read, as on the Sapphire Rapids build
# host; 4: below four rows each row streams the weights, as on this project's EPYC VM,
# where two decodes in one pass cost 1.99-2.01x one and four 2.80-2.88x).
CAL_TILED_ROWS = (0.0, 4.0)
# Fitted only with the batched rows, which are what identify it: the cost of a CPU pass
# that computes more than one sequence (``GPUProfile.cpu_multi_seq_s``; single requests
# never run one, so a fit on them alone leaves it 0). Bounded at 0.1 s: stop 50's idle
# calibrations read ~10-12 ms.
BATCH_FIT_FIELDS = ("cpu_multi_seq_s",)
_UPPER["cpu_multi_seq_s"] = 0.1
# What a host profile stores: the fitted fields and the discrete choice.
STORED_FIELDS = (*FIT_FIELDS, *BATCH_FIT_FIELDS, "cpu_tiled_rows")


def sim_batch(gpu: hardware.GPUProfile, model: hardware.ModelProfile, limits: InstanceConfig,
              batch: int, prompt: int, output: int) -> tuple[float, float]:
    """(first token, mean finish) of ``batch`` equal requests arriving together, in s."""
    eng = SimInstance(gpu, model, max_num_seqs=limits.max_num_seqs,
                      max_num_batched_tokens=limits.max_num_batched_tokens,
                      use_calibration=False)
    if limits.backend.get("type") == "llama_server":
        from agentflow.llm.llamacpp_server import configure_engine

        configure_engine(eng, limits.backend, model)
    for i in range(batch):
        eng.add(f"x{i}", prompt, output, 0, 0.0)
    ttft, ends = 0.0, []
    while (t := eng.next_event_time()) is not None:
        for ev in eng.step_until(t):
            if ev.kind == "first_token" and not ttft:
                ttft = ev.time
            if ev.kind == "finished":
                ends.append(ev.time)
    return ttft, float(np.mean(ends))


def sim_single(gpu: hardware.GPUProfile, model: hardware.ModelProfile, limits: InstanceConfig,
               prompt: int, output: int) -> tuple[float, float]:
    return sim_batch(gpu, model, limits, 1, prompt, output)


# Shapes a profile is compared on (two calibrations of one host, say): a short and a long
# prompt alone, a decode alone, a batch of four decodes.
REFERENCE_SHAPES = (("p2048 o1", 1, 2048, 1), ("p256 o24", 1, 256, 24), ("p32 o96", 1, 32, 96),
                    ("4 x p32 o64", 4, 32, 64))


def reference_times(g: hardware.GPUProfile, model: hardware.ModelProfile,
                    limits: InstanceConfig) -> dict[str, float]:
    """Simulated mean latency of each ``REFERENCE_SHAPES`` on ``g``: what two fits of one
    host are compared on, since their constants trade off against each other (a per-step
    overhead against a bandwidth) where their times need not."""
    return {name: sim_batch(g, model, limits, b, p, o)[1] for name, b, p, o in REFERENCE_SHAPES}


def batch_residuals(g: hardware.GPUProfile, model: hardware.ModelProfile,
                    limits: InstanceConfig, batched: list[tuple]) -> np.ndarray:
    """Relative error of each batched row: of its batch/lone latency ratio where the row has
    a lone time taken in the same minute (``(batch, prompt, output, total, lone)``), else of
    its simulated mean latency (``(batch, prompt, output, total)``, rows saved before)."""
    out = []
    for row in batched:
        b, p, o, total = row[:4]
        s_total = sim_batch(g, model, limits, b, p, o)[1]
        if len(row) > 4:
            s_ratio = s_total / sim_single(g, model, limits, p, o)[1]
            out.append(s_ratio / (total / row[4]) - 1.0)
        else:
            out.append((s_total - total) / total)
    return np.asarray(out)


def batched_rows(saved: list[tuple], by_share: bool) -> list[tuple]:
    """``(batch, prompt, output, total[, lone])`` from saved batched rows, with each time x
    its core share under ``by_share`` (older rows: no share or no lone time)."""
    out = []
    for r in saved:
        share = r[4] if by_share and len(r) > 4 else 1.0
        row: tuple = (r[0], r[1], r[2], r[3] * share)
        if len(r) > 6:
            row += (r[5] * (r[6] if by_share else 1.0),)
        out.append(row)
    return out


def profile_residuals(g: hardware.GPUProfile, model: hardware.ModelProfile,
                      limits: InstanceConfig, rows: list[tuple], batched: Sequence[tuple] = ()
                      ) -> np.ndarray:
    """Relative errors of ``g`` on the single rows (prefill and decode time) and the
    batched rows."""
    res = []
    for p, o, ttft, total in rows:
        s_ttft, s_total = sim_single(g, model, limits, p, o)
        res.append((s_ttft - ttft) / ttft)
        if o > 1:
            res.append(((s_total - s_ttft) - (total - ttft)) / (total - ttft))
    return np.concatenate([np.asarray(res), batch_residuals(g, model, limits, list(batched))])


def fit_profile(rows: list[tuple], base: hardware.GPUProfile, model: hardware.ModelProfile,
                limits: InstanceConfig, batched: Sequence[tuple] = ()) -> hardware.GPUProfile:
    """Least squares on the single rows (prefill and decode time) and, if given, the
    batched rows' batch/lone ratios (which also fit ``BATCH_FIT_FIELDS``)."""
    from scipy.optimize import least_squares

    names = (*FIT_FIELDS, *BATCH_FIT_FIELDS) if len(batched) else FIT_FIELDS

    def profile(x: np.ndarray) -> hardware.GPUProfile:
        return replace(base, **dict(zip(names, np.exp(x).tolist(), strict=True)))

    def residuals(x: np.ndarray) -> np.ndarray:
        return profile_residuals(profile(x), model, limits, rows, batched)

    upper = np.log([_UPPER.get(f, 10.0) for f in names])
    x0 = np.minimum(np.log([getattr(base, f) or 1e-3 for f in names]), upper - 1e-3)
    fit = least_squares(residuals, x0, bounds=(np.full(len(names), np.log(1e-5)), upper),
                        x_scale=1.0, diff_step=1e-3)
    err = np.abs(residuals(fit.x))
    print(f"fit: median |rel err| {np.median(err) * 100:.1f}%, max {err.max() * 100:.1f}% "
          f"over {len(err)} prefill/decode/batch times")
    return profile(fit.x)


@dataclass
class Measured:
    """One instance's calibration rows, and the speed probe's CPU seconds around them;
    ``corun``: the probe's (alone, beside busy neighbours) CPU-s pairs (``measure_corun``)."""

    rows: list[tuple]
    batched: list[tuple]
    joined: list[tuple]
    probes: list[float]
    corun: list[tuple[float, float]] = field(default_factory=list)


# --------------------------------------------------------------------------- co-run factor
# The rows are timed with every local instance busy at once, as they serve, so the fit
# prices a core beside busy neighbours. How much a core's work costs with its neighbours
# idle instead is measured apart: ``SPEED_PROBE`` on one instance with the others idle, and
# again while each other instance runs ``CORUN_LOAD`` round and round (a prompt and a
# decode, as serving mixes them), alternating which comes first each round so a drift of
# the machine's speed cancels over rounds. The median alone/beside ratio over all pairs is
# the host's ``GPUProfile.cpu_alone_factor``, which the simulator applies while a local
# engine's neighbours are idle (``agentflow.sim.host_corun``).
CORUN_LOAD = ((512, 16), (64, 32))


async def _keep_busy(backend: Any, make_prompt: Any, stop: asyncio.Event) -> int:
    """``CORUN_LOAD``'s requests one after another until ``stop`` (the one in flight then
    runs to its end: no cancelled request leaves the server working); how many ran."""
    from agentflow.llm.base import LLMRequest, SamplingParams

    n = 0
    while not stop.is_set():
        p, o = CORUN_LOAD[n % len(CORUN_LOAD)]
        await backend.generate(LLMRequest(prompt=make_prompt(p), params=SamplingParams(
            max_tokens=o, temperature=0.0), stage="corun-load"))
        n += 1
    return n


async def probe_beside_busy(backends: dict[str, Any], make_prompt: Any, name: str,
                            others: Sequence[str]) -> float | None:
    """``speed_probe`` on ``name`` while every instance of ``others`` keeps busy."""
    stop = asyncio.Event()
    loads = [asyncio.ensure_future(_keep_busy(backends[o], make_prompt, stop)) for o in others]
    try:
        await asyncio.sleep(0.2)  # the neighbours' first requests are in and running
        return await speed_probe(backends[name], make_prompt)
    finally:
        stop.set()
        await asyncio.gather(*loads)


async def measure_corun(backends: dict[str, Any], make_prompt: Any, names: Sequence[str],
                        rounds: int, *, tag: str = "") -> dict[str, list[tuple[float, float]]]:
    """Per instance of ``names``, ``rounds`` pairs (alone, beside busy) of the speed probe's
    CPU seconds, the instances taking turns (only one is probed at a time)."""
    pairs: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    if len(names) < 2:
        return pairs
    for r in range(rounds):
        for n in names:
            others = [o for o in names if o != n]
            got: dict[str, float | None] = {}
            for how in ("alone", "beside") if r % 2 == 0 else ("beside", "alone"):
                got[how] = await (speed_probe(backends[n], make_prompt) if how == "alone"
                                  else probe_beside_busy(backends, make_prompt, n, others))
            alone, beside = got["alone"], got["beside"]
            if alone is None or beside is None:
                print(f"{tag}# co-run probe {n}: no CPU clock, skipped", flush=True)
                return {m: [] for m in names}
            pairs[n].append((alone, beside))
            print(f"{tag}# co-run probe {n}, round {r + 1}: alone {alone:.3f} CPU-s, beside "
                  f"busy {', '.join(others)} {beside:.3f} CPU-s (alone/beside "
                  f"{alone / beside:.3f})", flush=True)
    return pairs


def busy_probe_samples(m: Measured) -> list[float]:
    """The speed probe's CPU-s on one instance with its neighbours busy: before and after
    its rows (every instance timed at once) and beside busy neighbours in the co-run rounds.
    The alone runs are left out: they are the other condition the co-run factor prices."""
    return [*m.probes, *(beside for _, beside in m.corun)]


def corun_factor(pairs: Sequence[tuple[float, float]]) -> float:
    """``cpu_alone_factor`` from (alone, beside) CPU-s pairs: their median ratio (1.0 with
    no pairs: nothing measured, nothing applied)."""
    if any(not (a > 0 and b > 0) for a, b in pairs):
        raise ValueError(f"co-run probe CPU seconds must be positive: {list(pairs)}")
    return float(np.median([a / b for a, b in pairs])) if pairs else 1.0


async def measure_instance(backend: Any, maker: PromptMaker, repeats: int, *,
                           cpu_clock: bool = True, tag: str = "") -> Measured:
    """The single, batched and joined rows of one instance, with ``SPEED_PROBE`` timed
    right before and right after them (on a CPU clock)."""
    probes: list[float] = []

    async def probe(when: str) -> None:
        got = await speed_probe(backend, maker.make) if cpu_clock else None
        if got is not None:
            probes.append(got)
            print(f"{tag}# speed probe {when}: {got:.3f} CPU-s", flush=True)

    await probe("before")
    clock = ServerClock(backend, use_cpu=cpu_clock)
    print(f"{tag}# single requests, timed on "
          + ("the server's CPU clock" if clock.cpu else "the wall clock"), flush=True)
    rows = await measure_single(backend, maker, repeats, cpu_clock=cpu_clock, tag=tag)
    print(f"{tag}# batched decode", flush=True)
    batched = await measure_batched(backend, maker, repeats, cpu_clock=cpu_clock, tag=tag)
    print(f"{tag}# a decode joined by a prompt", flush=True)
    joined = await measure_joined(backend, maker, repeats, cpu_clock=cpu_clock, tag=tag)
    await probe("after")
    return Measured(rows, batched, joined, probes)


def measure_together(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Measured]:
    """``measure_instance`` on every instance of ``names`` at once, as the cluster serves:
    each instance's core then works beside its busy neighbours, which on a machine whose
    cores share caches and memory (or are hyperthreads of one core) costs every core CPU
    seconds per unit of work that a core timed alone does not pay."""
    backends = start_backends(args.cluster)
    loop = asyncio.new_event_loop()
    try:
        maker = PromptMaker(tokenizer_of(backends, args.tokenizer), args.seed)
        cpu_clock = getattr(args, "cpu_clock", True)
        tags = {n: f"[{n}] " if len(names) > 1 else "" for n in names}

        async def every() -> list[Measured]:
            return await asyncio.gather(*(
                measure_instance(backends[n], maker, args.repeats, cpu_clock=cpu_clock,
                                 tag=tags[n]) for n in names))

        got = loop.run_until_complete(every())
        rounds = int(getattr(args, "corun_rounds", 0) or 0)
        if rounds > 0 and len(names) > 1 and cpu_clock:
            print(f"# co-run factor: the speed probe on each instance alone and beside the "
                  f"others busy, {rounds} round(s)", flush=True)
            pairs = loop.run_until_complete(measure_corun(backends, maker.make, names,
                                                          rounds))
            for m, n in zip(got, names, strict=True):
                m.corun = pairs[n]
        maker.close()
    finally:
        loop.run_until_complete(close_all(backends))
        close_loop(loop)
    return dict(zip(names, got, strict=True))


def measure_calibration(args: argparse.Namespace, name: str, cfg: InstanceConfig
                        ) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """The single, batched and joined rows of instance ``name`` alone."""
    print(f"# {name} ({cfg.gpu}, {cfg.model})")
    m = measure_together(args, [name])[name]
    return m.rows, m.batched, m.joined


def dedicated(rows: list[tuple], times: slice, by_share: bool) -> list[tuple]:
    """Rows without their last column, the share of the core the server got (rows saved
    before shares were recorded have none: 1.0); with ``by_share`` the ``times`` columns
    are scaled by it, to the seconds a dedicated core would have taken."""
    out = []
    for r in rows:
        width = times.stop
        share = r[width] if by_share and len(r) > width else 1.0
        cols = list(r[:width])
        cols[times] = [v * share for v in cols[times]]
        out.append(tuple(cols))
    return out


def print_batch_check(label: str, g: hardware.GPUProfile, model: hardware.ModelProfile,
                      limits: InstanceConfig, batched: list[tuple]) -> None:
    err = batch_residuals(g, model, limits, batched)
    cells = ", ".join(f"B{r[0]}/p{r[1]}: {e * 100:+.1f}%" for r, e in zip(batched, err))
    what = "batch/lone ratio" if batched and len(batched[0]) > 4 else "batched rows"
    print(f"{label}: {what} sim vs real {cells}; median |err| "
          f"{np.median(np.abs(err)) * 100:.1f}%")


@dataclass
class CalibrationFit:
    """A profile fitted on measured rows, with the rows and how well it fits them."""

    profile: hardware.GPUProfile
    median_error: float
    max_error: float
    rows: list[tuple]
    batched: list[tuple]
    joined: list[tuple]


def fit_rows(base: hardware.GPUProfile, model: hardware.ModelProfile, limits: InstanceConfig,
             rows: list[tuple], batched: list[tuple], joined: list[tuple], *,
             cpu_share: bool, fit_batched: bool) -> CalibrationFit:
    """``--calibrate``'s fit of measured rows (``measure_calibration``) on top of ``base``,
    printing each check as it goes."""
    if fit_batched and not batched:
        raise SystemExit("--fit-batched: no batched rows to fit")
    saved_rows, saved_batched = rows, batched
    single_rows = dedicated(rows, slice(2, 4), cpu_share)  # prompt, output, ttft, total
    batch_rows = batched_rows(batched, cpu_share)  # batch, prompt, output, total[, lone]
    print_batch_check("current profile", base, model, limits, batch_rows)
    if joined:
        print_joined_check("current profile", base, model, limits, joined)
    single = fit_profile(single_rows, base, model, limits)
    print_batch_check("fitted on single requests", single, model, limits, batch_rows)
    fitted = single
    if fit_batched:
        best = None
        for tiled in CAL_TILED_ROWS if not base.overlap_compute_memory else (0.0,):
            got = fit_profile(single_rows, replace(base, cpu_tiled_rows=tiled), model,
                              limits, batch_rows)
            err = float(np.median(np.abs(batch_residuals(got, model, limits, batch_rows))))
            print_batch_check(f"fitted on single + batched, cpu_tiled_rows {tiled:g}", got,
                              model, limits, batch_rows)
            if best is None or err < best[0]:
                best = (err, got)
        assert best is not None
        fitted = best[1]
    if joined:
        print_joined_check("fitted", fitted, model, limits, joined)
    err = np.abs(profile_residuals(fitted, model, limits, single_rows,
                                   batch_rows if fit_batched else []))
    return CalibrationFit(fitted, float(np.median(err)), float(err.max()), saved_rows,
                          saved_batched, joined)


