"""Helpers shared by the tests. Scheduler: a fixed-length model, a two-instance
coordinator whose time model makes every number checkable by hand, tiny workflow runs.
Server: the API's error shape, ``serve.py`` in a subprocess. Page: Debian's Chromium through
playwright."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import networkx as nx

from agentflow.scheduler import Coordinator, InstanceSpec
from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.lengths import LengthModel
from agentflow.scheduler.time_model import InstanceTimeModel
from agentflow.workflow import ManualClock, Node, NodeKind, Query, WorkflowRun


class FixedLengths(LengthModel):
    """Test double for the length model: a fixed output length per stage."""

    def __init__(self, lengths: dict[str, float | Distribution]):
        self.lengths = lengths

    def predict(self, stage, key_text="", input_tokens=None, *, max_tokens=None):
        value = self.lengths[stage]
        return value if isinstance(value, Distribution) else Distribution.point(value)

    def observe(self, stage, key_text, output_tokens, input_tokens=None):
        pass


def coordinator(policy: str, lengths: dict, *, slow: bool = False, alpha=None, max_inflight=1,
                **kw) -> Coordinator:
    specs = [InstanceSpec("fast", max_inflight=max_inflight)]
    if slow:
        specs.append(InstanceSpec("slow", max_inflight=max_inflight))
    c = Coordinator(specs, clock=ManualClock(0.0), policy=policy, alpha=alpha,
                    length_model=FixedLengths(lengths), **kw)
    c.time_models["fast"] = InstanceTimeModel(prefill_s_per_token=0.0, decode_s_per_token=1.0)
    if slow:
        c.time_models["slow"] = InstanceTimeModel(prefill_s_per_token=0.0, decode_s_per_token=2.0)
    return c


def llm(node_id: str, stage: str) -> Node:
    async def run(ctx):
        return None
    return Node(node_id, stage, NodeKind.LLM, run, hints={"prompt_tokens": 0})


def chain_run(query_id: str, deadline: float, stages: list[str]) -> WorkflowRun:
    g = nx.DiGraph()
    nodes = [llm(f"{query_id}.{i}", s) for i, s in enumerate(stages)]
    for n in nodes:
        g.add_node(n.id, node=n)
    g.add_edges_from((a.id, b.id) for a, b in zip(nodes, nodes[1:]))
    return WorkflowRun(Query("q", "db", arrival=0.0, slo_s=deadline, id=query_id), g)


def occupy(c: Coordinator, instance: str = "fast", tokens: float = 100) -> None:
    """Fill ``instance`` with one long call so later calls wait in its queue."""
    c.length_model.lengths.setdefault("blocker", tokens)
    c.on_query_arrival("blocker", deadline=None)
    call, decisions = c.on_call_ready("blocker", stage="blocker", node_id="b", prompt_tokens=0)
    assert [d.instance for d in decisions] == [instance]


# ---------------------------------------------------------------------------- server
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


def error_of(response) -> dict:
    """The API's one error shape, ``{"error": {"code", "message"}}``, checked; its inside."""
    body = response.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    return body["error"]


@contextmanager
def serve_process(config: Path, *, ready: str = "/healthz",
                  timeout_s: float = 90.0) -> Iterator[tuple[subprocess.Popen, str]]:
    """``serve.py --config config`` in a subprocess on a free loopback port, without API
    keys; yields ``(process, base url)`` once ``ready`` answers 200, and kills the process
    on the way out if it is still running (its output: ``process.stdout``). ``timeout_s`` is
    only a ceiling: a loaded 2-core machine has taken over 30 s to import and start."""
    import httpx

    from agentflow.server.settings import API_KEYS_ENV
    from agentflow.server.testing import free_socket

    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(API_KEYS_ENV, None)
    proc = subprocess.Popen([sys.executable, str(ROOT / "serve.py"), "--config", str(config),
                             "--port", str(port), "--log-level", "warning"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{url}{ready}", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()


def sigterm_with_a_query_in_flight(proc: subprocess.Popen, url: str, body: dict,
                                   timeout_s: float) -> tuple:
    """POST ``body`` (a ``wait=true`` query) from a thread, wait until the server lists it,
    then SIGTERM the server. Returns the thread and the dict its response lands in (``r``)."""
    import signal
    import threading

    import httpx

    result: dict = {}
    waiter = threading.Thread(target=lambda: result.update(r=httpx.post(
        f"{url}/v1/queries", json=body, timeout=timeout_s)))
    waiter.start()
    wait_until(lambda: httpx.get(f"{url}/v1/queries", timeout=30).json()["queries"],
               what="the query listed by the server")
    proc.send_signal(signal.SIGTERM)
    return waiter, result


@contextmanager
def held_calls(server, when: Callable | None = None) -> Iterator:
    """Hold the matching calls (``when(request)``, all by default) of every scripted
    backend behind a ``LiveServer`` in a gate for the with-block, released on the way out
    (``agentflow.llm.scripted.Hold``): a test that needs a query *in flight* has one by
    construction, not because its calls were slower than the test's own requests."""
    from agentflow.llm.scripted import Hold, ScriptedBackend

    hold = Hold(when)
    backends = [getattr(b, "inner", b) for b in server.service.af.backends.values()]
    scripted = [b for b in backends if isinstance(b, ScriptedBackend)]
    assert scripted, "no scripted backend to hold calls on"
    for backend in scripted:
        backend.hold = hold
    try:
        yield hold
    finally:
        hold.release()
        for backend in scripted:
            if backend.hold is hold:
                backend.hold = None


# ---------------------------------------------------------------------------- page
CHROMIUM = Path("/usr/bin/chromium")


def playwright_or_skip():
    """playwright's sync API, or skip the calling test module with the reason: it needs
    Debian's chromium (``.ci/install-browser``) and the ``playwright`` package, and never
    downloads a browser. Call at module level."""
    import pytest

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (run .ci/install-browser)",
                    allow_module_level=True)
    return pytest.importorskip("playwright.sync_api",
                               reason="the playwright Python package is not installed")


@contextmanager
def chromium(sync_api) -> Iterator:
    """A headless Chromium for one test module."""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            yield browser
        finally:
            browser.close()


def at_phone_width(page, width: int = 414) -> None:
    """Narrow the page to a phone's width; nothing may scroll sideways."""
    page.set_viewport_size({"width": width, "height": 900})
    page.wait_for_timeout(200)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width


def record_watchdog_fires(monkeypatch) -> list[str]:
    """Record each time the SQL watchdog interrupts a query (the engine kind it interrupted),
    so a timeout test can observe the interrupt instead of timing it on a loaded machine."""
    from agentflow.sql.database import _Interrupter

    fired: list[str] = []
    original = _Interrupter._fire

    def fire(self: _Interrupter) -> None:
        fired.append(self.kind)
        original(self)

    monkeypatch.setattr(_Interrupter, "_fire", fire)
    return fired


def record_parsing(monkeypatch) -> list[str]:
    """Record every sqlglot tokenize/parse/transpile call, so a test can show a statement was
    rejected before any parser ran (a counted step, not a stopwatch)."""
    import sqlglot
    from sqlglot.dialects.dialect import Dialect

    calls: list[str] = []
    for owner, name in ((Dialect, "tokenize"), (Dialect, "parse"), (sqlglot, "transpile"),
                        (sqlglot, "parse"), (sqlglot, "parse_one")):
        original = getattr(owner, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    return calls
