"""The page's recent-queries list shows each query's SLO class, in real headless Chromium
against a real server on loopback. The backend is scripted (not a model).

Queries of three classes: two sent over the HTTP API naming their class (an evaluation run's
``batch``, an ``interactive`` one), one asked on the page naming none (the default,
``standard``). Each list entry must show the class the server gave that query — read back
from the API by the entry's query id, not assumed."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("fastapi")
from tests.server.utils import chromium, playwright_or_skip  # noqa: E402

sync_api = playwright_or_skip()

from agentflow.api import AgentFlow  # noqa: E402
from agentflow.config import AgentFlowConfig  # noqa: E402
from agentflow.llm.scripted import ScriptedBackend  # noqa: E402
from agentflow.server.testing import LiveServer  # noqa: E402

pytestmark = pytest.mark.timeout(300)  # a ceiling; a loaded machine starts Chromium slowly


@pytest.fixture(scope="module")
def server():
    backend = ScriptedBackend(lambda r: "stores" if r.stage == "extract_keywords"
                              else "SELECT count(*) FROM stores", latency_s=0.05)
    af = AgentFlow(AgentFlowConfig(fewshot=None, slo_s=30), backends={"cpu-0": backend})
    try:
        with LiveServer({}, agentflow=af) as live:
            yield live
    finally:
        af.close()


def test_recent_list_shows_each_querys_class(server) -> None:
    sent = {}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for question, cls in (("How many stores? (eval)", "batch"),
                              ("How many stores? (person)", "interactive")):
            r = http.post("/v1/queries", json={"question": question, "db": "bookshop",
                                               "pipeline": "single", "slo_class": cls})
            assert r.status_code == 200, r.text
            sent[r.json()["query_id"]] = cls
    with chromium(sync_api) as browser:
        page = browser.new_page(viewport={"width": 1360, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server.url + "/")
        page.wait_for_selector("#db option[value=bookshop]", state="attached")
        page.fill("#question", "How many stores? (page)")
        page.select_option("#pipeline", "single")
        page.click("#ask-button")
        page.wait_for_function("() => document.querySelector('#status-badge').textContent "
                               "=== 'done'", timeout=60_000)
        # the list may have been drawn while the page's query still ran: wait for all done
        page.wait_for_function("() => { const li = document.querySelectorAll("
                               "'#recent li[data-id] .rmeta'); return li.length === 3 && "
                               "[...li].every(m => m.textContent.includes('· done')); }",
                               timeout=30_000)
        shown = page.evaluate("() => [...document.querySelectorAll('#recent li[data-id]')]"
                              ".map(li => [li.dataset.id, li.querySelector('.rmeta')"
                              ".textContent])")
        assert not errors, errors
        page.close()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        classes = {qid: http.get(f"/v1/queries/{qid}").json()["slo_class"]
                   for qid, _ in shown}
    assert {qid: classes[qid] for qid in sent} == sent  # the server kept what was asked
    assert sorted(classes.values()) == ["batch", "interactive", "standard"]
    for qid, meta in shown:
        parts = [p.strip() for p in meta.split("·")]
        assert parts[0] == "bookshop" and parts[1] == "done", meta
        assert parts[2].startswith(classes[qid]), meta  # then the latency / SLO text
