"""The web page in real headless Chromium: "Save as example" on an answer with editable SQL
(a refused SQL shows the server's reason, a corrected one is stored and reaches the next
prompt), the default database, the examples divider, and a recent query switching the
database selector. The backend is scripted (not a model)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from tests.conftest import make_library_sqlite  # noqa: E402
from tests.server.utils import chromium, playwright_or_skip  # noqa: E402

sync_api = playwright_or_skip()

from agentflow.api import AgentFlow  # noqa: E402
from agentflow.config import AgentFlowConfig  # noqa: E402
from agentflow.llm.scripted import ScriptedBackend  # noqa: E402
from agentflow.server.testing import LiveServer  # noqa: E402

pytestmark = pytest.mark.timeout(120)
WRONG = "SELECT * FROM stores WHERE store_id = 1"
RIGHT = "SELECT count(*) FROM stores"
prompts: list[str] = []


def script(request) -> str:
    prompts.append(request.prompt)
    if "library" in request.prompt or "book" in request.prompt.lower().split("-- sql:")[-1]:
        return "SELECT count(*) FROM book"
    return WRONG


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("page-teach")
    # "archive" sorts before "bookshop": the page must still open on the demo database
    archive = make_library_sqlite(tmp / "archive.sqlite")
    config = AgentFlowConfig(fewshot=None, pipeline="single", teaching_store=str(tmp / "t.db"),
                             databases={"archive": {"url": f"sqlite:///{archive}"}})
    af = AgentFlow(config, backends={"s": ScriptedBackend(script)})
    with LiveServer({}, agentflow=af) as live:
        yield live
    af.close()


@pytest.fixture(scope="module")
def browser():
    with chromium(sync_api) as browser:
        yield browser


def test_save_as_example_with_corrected_sql(server, browser) -> None:
    import httpx

    page = browser.new_page(viewport={"width": 1360, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.wait_for_selector("#db option[value=archive]", state="attached")
    assert page.input_value("#db") == "bookshop"
    assert page.is_visible("#examples")  # the demo has sample questions

    page.fill("#question", "How many stores are there?")
    page.click("#ask-button")
    page.wait_for_selector("#teach-button", state="visible")
    assert not page.is_visible("#teach-form")
    page.click("#teach-button")
    assert page.input_value("#teach-question") == "How many stores are there?"
    assert page.input_value("#teach-sql") == WRONG  # the answer's SQL, to correct

    page.fill("#teach-sql", "SELECT count(*) FROM shops")  # not a table: refused
    page.click("#teach-save")
    page.wait_for_selector("#teach-error", state="visible")
    assert "shops" in page.text_content("#teach-error")
    listed = httpx.get(f"{server.url}/v1/databases/bookshop/examples").json()["examples"]
    assert "How many stores are there?" not in [e["question"] for e in listed]

    page.fill("#teach-sql", RIGHT)
    page.click("#teach-save")
    page.wait_for_selector("#teach-note.ok")
    assert "Saved as example" in page.text_content("#teach-note")
    assert not page.is_visible("#teach-form")
    listed = httpx.get(f"{server.url}/v1/databases/bookshop/examples").json()["examples"]
    saved = [e for e in listed if e["question"] == "How many stores are there?"]
    assert saved and saved[0]["sql"] == RIGHT

    prompts.clear()
    page.fill("#question", "How many stores are there in total?")
    page.click("#ask-button")
    page.wait_for_function("() => document.getElementById('ask-button').textContent === 'Ask'"
                           " && !document.getElementById('teach-bar').hidden")
    assert any(f"-- Question: How many stores are there?\n{RIGHT};" in p for p in prompts)
    assert not errors, errors


def test_no_divider_without_examples_and_recent_query_switches_database(server,
                                                                       browser) -> None:
    page = browser.new_page(viewport={"width": 1360, "height": 1000})
    page.goto(server.url + "/")
    page.wait_for_selector("#db option[value=archive]", state="attached")
    page.select_option("#db", "archive")
    assert not page.is_visible("#examples")  # no "Try one of these" over nothing
    page.fill("#question", "How many books are in the library?")
    page.click("#ask-button")
    page.wait_for_selector("#teach-bar:not([hidden])")
    page.select_option("#db", "bookshop")
    page.wait_for_selector("#recent li[data-id]")
    page.click("#recent li[data-id] >> nth=0")
    page.wait_for_function("() => document.getElementById('db').value === 'archive'")
    assert "archive" in page.text_content("#result-meta")
