"""The web page in a real headless Chromium: ask a question on the demo database, watch the
live timeline, see the SQL and the result table. Saves ``artifacts/web-page.png``.

Needs Debian's chromium at /usr/bin/chromium (``.ci/install-browser``) and the Python
``playwright`` package; skips with the reason when either is missing (it never downloads a
browser).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from tests.server.utils import chromium, held_calls, playwright_or_skip  # noqa: E402

sync_api = playwright_or_skip()

from agentflow.server.testing import LiveServer, scripted_instance  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def server():
    # Slow enough calls that the page shows the pipeline while it runs; one call at a time
    # per instance, so three candidates on two instances queue (hatched on the timeline).
    with LiveServer({"instances": [scripted_instance("a100-0", latency_s=0.25, gpu="A100-80G",
                                                     max_inflight=1),
                                   scripted_instance("l40s-0", latency_s=0.4, gpu="L40S",
                                                     max_inflight=1)],
                     "slo_s": 1.5}) as live:
        yield live


@pytest.fixture(scope="module")
def browser():
    with chromium(sync_api) as browser:
        yield browser


def test_ask_on_the_demo_database_shows_timeline_sql_and_rows(server, browser) -> None:
    page = browser.new_page(viewport={"width": 1360, "height": 1000})
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    page.goto(server.url + "/")
    page.wait_for_selector("#db option[value=bookshop]", state="attached")
    assert page.locator("#tables span").count() == 8
    page.wait_for_selector(".inst")  # the cluster's instances in the header
    # Candidate calls wait in a gate until the test has seen the page mid-run: the live
    # timeline is there by construction, however slowly a loaded machine draws it.
    with held_calls(server, lambda r: r.stage == "generate_candidate") as hold:
        page.fill("#question", "How many stores are there?")
        page.click("#ask-button")
        hold.wait_held(1)

        # live: a stage is drawn as running before the answer is there (candidates under way)
        page.wait_for_function("() => document.querySelectorAll('.tl-row').length >= 5 && "
                               "document.querySelector('.tl-bar.running') !== null",
                               timeout=60_000)
        assert page.locator("#status-badge").inner_text() in ("running", "pending")
        assert page.locator("#result-table td").count() == 0
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "web-page-running.png"), full_page=True)

    page.wait_for_selector("#result-table td", timeout=60_000)
    assert page.locator("#status-badge").inner_text() == "done"
    assert page.locator("#result-table th").all_inner_texts() == ["count(*)"]
    assert page.locator("#result-table td").all_inner_texts() == ["12"]
    sql = page.locator("#sql-code")
    assert sql.inner_text().strip() == "SELECT count(*) FROM stores"
    assert sql.locator(".sql-kw").count() >= 2  # highlighted
    rows = page.locator(".tl-row")
    assert rows.count() >= 8
    assert page.locator("#timeline .tl-bar.run").count() >= 4  # one per LLM call, in colour
    info = " ".join(page.locator(".tl-info").all_inner_texts())
    assert "a100-0" in info and "queue" in info
    assert page.locator("#timeline .tl-bar.queue").count() >= 1  # not the legend's swatch
    assert page.locator(".tl-slo").count() >= 1  # the SLO line
    assert "SLO" in page.locator("#latency").inner_text()
    page.wait_for_selector("#recent li[data-id]")
    assert "How many stores" in page.locator("#recent").inner_text()

    page.screenshot(path=str(ARTIFACTS / "web-page.png"), full_page=True)
    assert not errors, errors
    assert all(u.startswith(server.url) or u.startswith("data:") for u in requests), requests
    page.close()


def test_bad_input_is_shown_on_the_page(server, browser) -> None:
    page = browser.new_page()
    page.goto(server.url + "/")
    page.wait_for_selector("#db option[value=bookshop]", state="attached")
    page.fill("#question", "How many stores are there?")
    page.fill("#slo", "-2")
    page.click("#ask-button")
    page.wait_for_selector("#form-error:not([hidden])")
    assert "positive number" in page.locator("#form-error").inner_text()
    page.close()


def test_the_install_script_is_idempotent_when_chromium_is_there() -> None:
    script = Path(__file__).resolve().parents[2] / ".ci" / "install-browser"
    assert script.exists() and shutil.which("bash")
    import subprocess

    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "already installed" in out.stdout
