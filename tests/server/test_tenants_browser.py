"""The web page under tenants (issue 20 §1), in a real headless Chromium: with tenant A's key
the recent-queries list shows A's questions only — never B's — and with B's key B's only.
Instances are scripted (not a model).
Saves ``artifacts/web-page-tenant.png``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
from tests.server.utils import chromium, playwright_or_skip  # noqa: E402

sync_api = playwright_or_skip()

from agentflow.server.testing import LiveServer, scripted_instance  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
pytestmark = pytest.mark.timeout(90)
KEY_A, KEY_B = "page-key-acme-1", "page-key-bolt-2"


@pytest.fixture(scope="module")
def server():
    settings = {"tenants": [{"name": "acme", "keys": [KEY_A]},
                            {"name": "bolt", "keys": [KEY_B]}]}
    with LiveServer({"instances": [scripted_instance("gpu-0", latency_s=0.01)],
                     "pipeline": "single"}, settings) as live:
        yield live


def ask(server, key: str, question: str) -> dict:
    r = httpx.post(f"{server.url}/v1/queries", headers={"X-API-Key": key}, timeout=60,
                   json={"question": question, "db": "bookshop"})
    assert r.status_code == 200, r.text
    return r.json()


def recent_on_page(browser, server, key: str) -> list[str]:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.add_init_script(f"localStorage.setItem('agentflow.apiKey', {key!r})")
    page.goto(server.url + "/")
    page.wait_for_selector("#recent li[data-id]", timeout=15_000)
    texts = page.locator("#recent li[data-id] .q").all_inner_texts()
    if key == KEY_A:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "web-page-tenant.png"), full_page=True)
    page.close()
    return texts


def test_the_page_lists_only_the_keys_own_queries(server) -> None:
    mine = [ask(server, KEY_A, f"How many stores are there? (acme {i})")["query_id"]
            for i in range(2)]
    ask(server, KEY_B, "How many stores are there? (bolt secret)")
    assert mine
    with chromium(sync_api) as browser:
        a = recent_on_page(browser, server, KEY_A)
        b = recent_on_page(browser, server, KEY_B)
    assert sorted(a) == ["How many stores are there? (acme 0)",
                         "How many stores are there? (acme 1)"]
    assert b == ["How many stores are there? (bolt secret)"]
