"""The demo database loaded into a real PostgreSQL and served: `GET /v1/databases`, answers
over HTTP and the web page in headless Chromium — with the database's URL (host, port, role,
password) never shown. Instances are scripted (no model); the SQL runs on PostgreSQL."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.server.testing import GOOD_SQL, LiveServer, scripted_instance  # noqa: E402

PASSWORD = "demo-Pa55-word"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def demo_pg(pg_server):
    """`agentflow datasets to-postgres demo` into database `bench`, readable by `bench_reader`."""
    import psycopg

    from agentflow.datasets import load_dataset
    from agentflow.datasets.to_postgres import load_sqlite_into_postgres

    pg_server.create_database("bench")
    pg_server.create_reader("bench_reader", PASSWORD, "bench")
    demo = load_dataset("demo")
    with psycopg.connect(host=str(pg_server.socket_dir), port=pg_server.port, user="postgres",
                         dbname="bench") as conn:
        report = load_sqlite_into_postgres(demo.databases["bookshop"].sqlite_path, conn,
                                           "bookshop", grant_to="bench_reader")
    assert report.tables == 8 and report.rows > 1000 and not report.notes
    return pg_server


@pytest.fixture(scope="module")
def server(demo_pg):
    import os

    os.environ["BENCH_DB_PASSWORD"] = PASSWORD
    config = {"instances": [scripted_instance("gpu-a", latency_s=0.05)], "slo_s": 30,
              "databases": {"bookshop_pg": {"url": demo_pg.url("bench_reader", "bench"),
                                            "search_path": ["bookshop"],
                                            "password_env": "BENCH_DB_PASSWORD",
                                            "pool_size": 2, "require_read_only_role": True}}}
    with LiveServer(config) as live:
        yield live


def secrets_of(pg) -> list[str]:
    return [PASSWORD, "postgresql://", f":{pg.port}", "127.0.0.1", "bench_reader"]


def test_databases_listing_shows_postgres_without_its_url(server, demo_pg) -> None:
    r = httpx.get(f"{server.url}/v1/databases", timeout=30)
    assert r.status_code == 200
    entry = next(d for d in r.json()["databases"] if d["id"] == "bookshop_pg")
    assert entry["engine"] == "postgresql" and "stores" in entry["tables"]
    for secret in secrets_of(demo_pg):
        assert secret not in r.text, secret


def test_question_on_postgres_is_answered_over_http(server, demo_pg) -> None:
    r = httpx.post(f"{server.url}/v1/queries", timeout=60,
                   json={"question": "How many stores are there?", "db": "bookshop_pg"})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["status"] == "done", answer
    assert answer["sql"] == GOOD_SQL and answer["rows"] == [[12]]
    for text in (r.text, httpx.get(f"{server.url}/metrics", timeout=30).text,
                 httpx.get(f"{server.url}/v1/queries", timeout=30).text):
        for secret in secrets_of(demo_pg):
            assert secret not in text, secret


def test_web_page_answers_on_postgres(server, demo_pg) -> None:
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.skip(f"no Chromium at {chromium} (run .ci/install-browser)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1360, "height": 1000})
        page.goto(server.url + "/")
        page.wait_for_selector("#db option[value=bookshop_pg]", state="attached")
        page.select_option("#db", "bookshop_pg")
        page.fill("#question", "How many stores are there?")
        page.click("#ask-button")
        page.wait_for_selector("#result-table td", timeout=60_000)
        assert page.locator("#status-badge").inner_text() == "done"
        assert page.locator("#result-table td").all_inner_texts() == ["12"]
        html = page.content()
        for secret in secrets_of(demo_pg):
            assert secret not in html, secret
        artifacts = Path(__file__).resolve().parents[2] / "artifacts"
        artifacts.mkdir(exist_ok=True)
        page.screenshot(path=str(artifacts / "web-page-postgres.png"), full_page=True)
        browser.close()
    assert shutil.which("bash")
