"""Helpers for the server and page tests: the API's error shape, ``serve.py`` in a
subprocess, held scripted calls, Debian's Chromium through playwright."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.utils import ROOT, wait_until


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
