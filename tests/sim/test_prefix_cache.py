"""Automatic prefix caching: chained block hashes, the LRU sets, the simulated engine's cache
(hits skip prefill; held blocks stay; evictable ones go LRU, tail first, when memory is
needed), the ``--cached-prefix auto`` switch (HexGen-Flow traces unchanged, byte for byte),
and ``cache_aware`` dispatch with the router-side index (locality at equal load, not onto an
overloaded holder)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentflow import hardware
from agentflow.scheduler import Coordinator, InstanceSpec, StartCall
from agentflow.scheduler.prefix_index import (
    BLOCK_TOKENS,
    CHARS_PER_TOKEN,
    LRUBlocks,
    PrefixIndex,
    block_hashes,
    pseudo_tokens,
)
from agentflow.scheduler.time_model import InstanceTimeModel
from agentflow.sim.engine import SimInstance
from agentflow.workflow import ManualClock
from tests.scheduler.utils import FixedLengths

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "traces" / "hexgen-flow"
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN


def text(seed: str, blocks: int) -> str:
    """``blocks`` full blocks of text that differ from any other seed's in every block."""
    return "".join(f"{seed}:{i:06d}|".ljust(BLOCK_CHARS, "x") for i in range(blocks))


# ---------------------------------------------------------------------------- hashing
def test_block_hashes_are_chained_over_full_blocks_only() -> None:
    schema = text("schema", 10)
    a = block_hashes(schema + text("question-a", 3) + "tail")
    b = block_hashes(schema + text("question-b", 3))
    assert len(a) == 13 and len(b) == 13  # the partial tail block is not keyed
    assert a[:10] == b[:10] and all(x != y for x, y in zip(a[10:], b[10:]))
    # chained: a change in block 0 changes every later block's key, though they match
    c = block_hashes("Z" + schema[1:])
    assert all(x != y for x, y in zip(c, block_hashes(schema)))
    assert block_hashes("x" * (BLOCK_CHARS - 1)) == ()
    assert pseudo_tokens("x" * 9) == 3
    # non-ASCII text is cut by characters, deterministically
    assert block_hashes("é" * BLOCK_CHARS * 2) == block_hashes("é" * BLOCK_CHARS * 2)
    assert len(block_hashes("é" * BLOCK_CHARS * 2)) == 2


def test_lru_blocks_match_leading_blocks_and_evict_least_recent() -> None:
    s = LRUBlocks(capacity=4)
    h = block_hashes(text("p", 6))
    s.insert(h[:3])
    # a prompt differing only in its first block shares no block (the keys are chained)
    assert s.match(h) == 3 and s.match(block_hashes("Q" + text("p", 6)[1:])) == 0
    s.insert(h[:2])  # touch the head: block 2 is now the least recent
    s.insert(h[3:5])
    assert len(s) == 4 and h[2] not in s and s.match(h) == 2
    with pytest.raises(ValueError):
        LRUBlocks(0)
    index = PrefixIndex({"a": 10, "b": 10})
    index.record("b", h)
    assert index.matched_blocks(h[:4], ["a", "b"]) == [0, 4]
    index.forget_instance("b")
    assert index.matched_blocks(h, ["a", "b"]) == [0, 0]


# ---------------------------------------------------------------------------- engine
def engine(blocks: int | None = None) -> SimInstance:
    return SimInstance(hardware.gpu("A100-80G"), hardware.model("Llama-3.1-8B"),
                       num_gpu_blocks=blocks)


def run_alone(eng: SimInstance, seq_id: str, prompt: str, out: int, now: float):
    """Add one request with its prefix hashes at ``now`` and run it; its finish event."""
    eng.add(seq_id, pseudo_tokens(prompt), out, 0, now, prefix_hashes=block_hashes(prompt),
            tokens_per_block=BLOCK_TOKENS)
    events = eng.step_until(now + 1e6)
    return next(e for e in events if e.kind == "finished" and e.seq_id == seq_id)


def test_a_sibling_on_the_instance_that_holds_the_prefix_prefills_less() -> None:
    shared = text("schema+question", 150)  # 2,400 tokens
    first, sibling = shared + text("stage-1", 10), shared + text("stage-2", 10)
    warm = engine()
    run_alone(warm, "first", first, 1, 0.0)
    hit = run_alone(warm, "sibling", sibling, 1, 100.0)
    cold = run_alone(engine(), "sibling", sibling, 1, 0.0)
    assert warm.prefix_hit_tokens == 150 * BLOCK_TOKENS
    assert hit.ttft_s < 0.5 * cold.ttft_s  # 160 of 2,560 prompt tokens left to prefill
    # without hashes the engine is what it was: same time as the cold run
    plain = engine()
    plain.add("sibling", pseudo_tokens(sibling), 1, 0, 0.0)
    done = [e for e in plain.step_until(1e6) if e.kind == "finished"][0]
    assert done.ttft_s == cold.ttft_s


def test_evictable_blocks_go_lru_tail_first_when_memory_is_needed() -> None:
    eng = engine(blocks=200)
    a = text("a", 100)
    run_alone(eng, "a", a, 1, 0.0)  # 100 blocks, now evictable
    run_alone(eng, "c", text("c", 150), 1, 10.0)  # takes 150: 50 of a's must go
    run_alone(eng, "a2", a + text("a2", 5), 1, 20.0)
    # a's blocks were freed tail first, so its head (50 blocks) survived
    assert eng.prefix_hit_tokens == 50 * BLOCK_TOKENS


def test_blocks_held_by_a_running_sequence_are_not_evicted() -> None:
    eng = engine(blocks=300)
    a = text("a", 100)
    eng.add("a", pseudo_tokens(a), 400, 0, 0.0, prefix_hashes=block_hashes(a),
            tokens_per_block=BLOCK_TOKENS)
    eng.step_until(1.0)  # a is decoding, holding its 100 prompt blocks
    c = text("c", 170)  # memory pressure while a runs
    eng.add("c", pseudo_tokens(c), 1, 0, 1.0, prefix_hashes=block_hashes(c),
            tokens_per_block=BLOCK_TOKENS)
    assert "c" in {e.seq_id for e in eng.step_until(2.0) if e.kind == "finished"}
    assert eng.load().running == 1  # a
    eng.add("a2", pseudo_tokens(a) + 80, 1, 0, 2.0,
            prefix_hashes=block_hashes(a + text("a2", 5)), tokens_per_block=BLOCK_TOKENS)
    eng.step_until(1e6)
    assert eng.prefix_hit_tokens == 100 * BLOCK_TOKENS


# ---------------------------------------------------------------------------- switch
def simulate_json(tmp_path: Path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    subprocess.run([sys.executable, "-m", "agentflow.cli.main", "simulate", *args,
                    "--json", str(out)], check=True, capture_output=True, cwd=ROOT)
    return json.loads(out.read_text())


@pytest.mark.skipif(not (TRACES / "trace1.json").is_file(), reason="shared traces absent")
def test_hexgen_traces_are_unchanged_by_the_prefix_cache(tmp_path) -> None:
    common = ["--trace", str(TRACES / "trace1.json"), "--cluster", "paper-4gpu",
              "--rate", "0.05", "--queries", "30",
              "--policy", "marginal_delay+fcfs,cache_aware+fcfs"]
    off = simulate_json(tmp_path, "off", *common)
    on = simulate_json(tmp_path, "on", *common, "--cached-prefix", "auto")
    assert on["config"].pop("cached_prefix") == "auto"
    assert off["config"].pop("cached_prefix") == 0.0
    assert json.dumps(on, sort_keys=True) == json.dumps(off, sort_keys=True)
    # and without text cache_aware is exactly marginal_delay
    p = on["policies"]
    assert json.dumps(p["cache_aware+fcfs"]) == json.dumps(p["marginal_delay+fcfs"])


def test_cached_prefix_rejects_anything_but_a_fraction_or_auto(tmp_path) -> None:
    bad = subprocess.run([sys.executable, "-m", "agentflow.cli.main", "simulate", "--trace",
                          "x.json", "--cached-prefix", "sometimes"], capture_output=True,
                         text=True, cwd=ROOT)
    assert bad.returncode == 2 and "fraction in [0, 1) or 'auto'" in bad.stderr


def test_an_agentflow_trace_with_text_runs_faster_with_the_cache(tmp_path) -> None:
    """Replay: one query whose three parallel calls share a long prefix, on one instance."""
    from agentflow.sim.cluster import load_cluster
    from agentflow.sim.driver import Simulation
    from agentflow.sim.workload import load_agentflow

    shared = text("schema", 400)
    nodes = [{"id": f"n{i}", "stage": "generate_candidate", "kind": "llm", "parents": [],
              "status": "ok", "start": 0, "end": 1,
              "calls": [{"prompt_tokens": pseudo_tokens(shared) + 40, "completion_tokens": 20,
                         "max_tokens": 64, "prompt": shared + text(f"c{i}", 10)}]}
             for i in range(3)]
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"query_id": "q", "question": "?", "nodes": nodes}) + "\n")
    trace = load_agentflow(path)
    assert trace[0].nodes[0].prompt_text.startswith("schema")
    cluster = load_cluster("paper-4gpu")
    arrivals = [0.0, 100.0]  # the second arrival finds the prefix cached (same instance)

    def latency(mode):
        sim = Simulation(cluster, "cache_aware+fcfs", cached_prefix=mode)
        result = sim.run(trace * 2, arrivals, [1e6, 1e6], [1.0, 1.0])
        hits = sum(e.prefix_hit_tokens for e in sim.instances.values())
        return [r.latency_s for r in result.records], hits

    (cold1, cold2), no_hits = latency(0.0)
    (warm1, warm2), hits = latency("auto")
    assert no_hits == 0 and hits > 0
    assert warm2 < cold2 / 3
    # The first query has nothing cached yet; cache-aware placement puts two of its siblings
    # on one instance, where they share steps (the operator model charges a step for all of
    # its tokens), so it may finish a little later than when spread over three instances.
    assert warm1 < cold1 * 1.05


# ---------------------------------------------------------------------------- dispatch
def cache_coordinator() -> Coordinator:
    specs = [InstanceSpec("a", max_inflight=8), InstanceSpec("b", max_inflight=8)]
    c = Coordinator(specs, clock=ManualClock(0.0), policy="cache_aware+fcfs",
                    length_model=FixedLengths({"gen": 10.0}))
    for name in ("a", "b"):  # prefill dominates: 10 ms a token, 10 ms an output token
        c.time_models[name] = InstanceTimeModel(prefill_s_per_token=0.01,
                                                decode_s_per_token=0.01)
    return c


def ready(c: Coordinator, query: str, node: str, prompt: str):
    if query not in c.queries:
        c.on_query_arrival(query, deadline=1e6)
    call, decisions = c.on_call_ready(query, stage="gen", node_id=node,
                                      prompt_tokens=pseudo_tokens(prompt), prompt_text=prompt)
    return call, decisions


def finish(c: Coordinator, call) -> None:
    c.on_call_cancelled(call)  # frees it without teaching the time models


def test_cache_aware_dispatch_follows_the_prefix_at_equal_load_not_onto_a_backlog() -> None:
    c = cache_coordinator()
    shared = text("schema+question", 100)  # 1,600 tokens: 16 s of prefill saved
    other, _ = ready(c, "u", "u0", text("unrelated", 100))
    assert other.instance == "a"  # tie at equal load: by name
    first, _ = ready(c, "q", "q0", shared + text("s0", 5))
    assert first.instance == "b"  # a is busy
    finish(c, other)
    finish(c, first)
    sibling, _ = ready(c, "q", "q1", shared + text("s1", 5))
    assert sibling.instance == "b"  # equal (zero) load: the holder, though "a" ties first
    finish(c, sibling)
    # without the prefix, the same situation goes to "a" (marginal_delay's tie-break)
    stranger, _ = ready(c, "v", "v0", text("stranger", 105))
    assert stranger.instance == "a"
    finish(c, stranger)
    # overload the holder: a's down while ten long calls pile onto b
    c.on_instance_down("a")
    backlog = [ready(c, "w", f"w{i}", text(f"w{i}", 200))[0] for i in range(10)]
    assert {x.instance for x in backlog} == {"b"}
    c.on_instance_up("a")
    late, _ = ready(c, "q", "q2", shared + text("s2", 5))
    assert late.instance == "a"  # the hit saves 16 s; b's backlog is far more


def test_earliest_finish_keeps_no_prefix_index() -> None:
    c = Coordinator([InstanceSpec("a"), InstanceSpec("b")], clock=ManualClock(0.0),
                    policy="earliest_finish+fcfs", length_model=FixedLengths({"gen": 10.0}))
    assert c.prefix_index is None
    call, decisions = ready(c, "q", "q0", text("x", 3))
    assert call.prefix_hashes and isinstance(decisions[0], StartCall)
