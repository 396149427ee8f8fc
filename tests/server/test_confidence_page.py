"""The web page in a real headless Chromium shows how sure an answer is: a visible warning when
the pipeline's confidence is low, and an "unsure" answer's best guess under the threshold.

The scripted backend (not a model) makes the three chess candidates disagree and writes no
unit test, which is what scores low.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from tests.server.utils import chromium, playwright_or_skip  # noqa: E402

sync_api = playwright_or_skip()

from agentflow.server.testing import LiveServer  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
pytestmark = pytest.mark.timeout(90)
COUNT = "SELECT count(*) FROM stores"


def _instance(candidates: list[str]) -> dict:
    return {"name": "s0", "backend": {
        "type": "scripted", "default": COUNT,
        "answers": {"extract_keywords": "stores", "generate_unit_test": "",
                    "generate_candidate": candidates}}}


@pytest.fixture(scope="module")
def browser():
    with chromium(sync_api) as browser:
        yield browser


def _ask(server: LiveServer, browser, question: str):
    page = browser.new_page(viewport={"width": 1360, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.wait_for_selector("#db option[value=bookshop]", state="attached")
    page.fill("#question", question)
    page.click("#ask-button")
    page.wait_for_selector("#answer-confidence:not([hidden])", timeout=30_000)
    return page, errors


def test_low_confidence_shows_a_warning_with_its_reasons(browser) -> None:
    candidates = [COUNT, "SELECT count(*) FROM customers", "SELECT count(*) FROM books"]
    with LiveServer({"instances": [_instance(candidates)]}) as server:
        page, errors = _ask(server, browser, "How many stores are there?")
        box = page.locator("#answer-confidence")
        assert "low" in (box.get_attribute("class") or "").split()
        assert box.is_visible()
        text = box.inner_text()
        assert "Low confidence" in text and "likely wrong" in text
        assert "1 of 3 candidates agree" in text and "no usable unit test" in text
        # below the default min_confidence: unsure, not done
        assert page.locator("#status-badge").inner_text() == "unsure"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "web-page-low-confidence.png"), full_page=True)
        assert not errors, errors
        page.close()


def test_high_confidence_is_no_warning(browser) -> None:
    with LiveServer({"instances": [_instance([COUNT])]}) as server:
        page, errors = _ask(server, browser, "How many stores are there?")
        box = page.locator("#answer-confidence")
        assert "high" in (box.get_attribute("class") or "").split()
        assert "Low confidence" not in box.inner_text()
        assert not errors, errors
        page.close()


def test_unsure_answer_shows_the_best_guess_and_says_so(browser) -> None:
    candidates = [COUNT, "SELECT count(*) FROM customers", "SELECT count(*) FROM books"]
    with LiveServer({"instances": [_instance(candidates)], "min_confidence": 0.5}) as server:
        page, errors = _ask(server, browser, "How many stores are there?")
        page.wait_for_selector("#result-table td", timeout=30_000)
        assert page.locator("#status-badge").inner_text() == "unsure"
        # one clear line: the badge says "unsure", the box says why (not "unsure: not sure")
        line = page.locator("#answer-error").inner_text()
        assert line.startswith("not sure: confidence") and "unsure" not in line, line
        assert page.locator("#result-table td").count() >= 1  # the best guess is shown
        assert not errors, errors
        page.close()
