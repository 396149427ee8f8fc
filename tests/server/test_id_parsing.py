"""Issue 35 §8: every id a client sends is parsed totally: a 404 or a 422, never a 500.

The real uvicorn server on loopback with a scripted instance (NOT a model). Before the fix,
``Last-Event-ID: ²`` (``"²".isdigit()`` is true, ``int("²")`` raises) and a 5,000-digit one
(``int`` refuses 4,300+ digits) were 500s, as were taught-example ids past int64 (SQLite
cannot bind them) and a glossary id written in non-ASCII digits.
"""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.server.testing import LiveServer, scripted_instance  # noqa: E402

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def live():
    with LiveServer({"instances": [scripted_instance("a")]}) as server:
        yield server


def test_last_event_id_that_is_not_a_count_is_a_422(live) -> None:
    r = httpx.post(f"{live.url}/v1/queries", json={"question": "How many stores are there?",
                                                    "db": "bookshop"}, timeout=60)
    assert r.status_code == 200, r.text
    url = f"{live.url}/v1/queries/{r.json()['query_id']}/events"
    for bad in ("²", "9" * 5000, "12a", "-1", "١٢"):
        try:  # a header is bytes; the server reads them as latin-1 ("\xb2" is "²")
            raw = bad.encode("latin-1")
        except UnicodeEncodeError:
            raw = bad.encode("utf-8")
        got = httpx.get(url, headers={"Last-Event-ID": raw}, timeout=30)
        assert got.status_code == 422, (bad[:10], got.status_code, got.text[:200])
        assert got.json()["error"]["code"] == "invalid_request"
    with httpx.stream("GET", url, headers={"Last-Event-ID": "1"}, timeout=30) as ok:
        assert ok.status_code == 200
        assert "event: done" in ok.read().decode()


@pytest.mark.parametrize("path, status", [
    (f"/v1/databases/bookshop/examples/{2 ** 70}", 404),
    (f"/v1/databases/bookshop/examples/{2 ** 63}", 404),
    ("/v1/databases/bookshop/examples/0", 404),
    ("/v1/databases/bookshop/examples/%C2%B2", 422),
    (f"/v1/databases/bookshop/glossary/{'9' * 5000}", 404),
    (f"/v1/databases/bookshop/glossary/{2 ** 70}", 404),
    ("/v1/databases/bookshop/glossary/%C2%B2", 404),
    ("/v1/databases/bookshop/glossary/%D9%A1%D9%A2", 404),
])
def test_taught_ids_are_a_404_or_422_never_a_500(live, path: str, status: int) -> None:
    r = httpx.delete(f"{live.url}{path}", timeout=30)
    assert r.status_code == status, (path[:60], r.status_code, r.text[:200])
    assert r.json()["error"]["message"]


def test_the_python_and_mcp_road_says_not_found() -> None:
    """``forget_example`` (what MCP ``forget_taught`` calls) answers False for an id that
    cannot exist, so the tool's error says "nothing to delete"."""
    from agentflow.teaching import row_id_of

    assert [row_id_of(v) for v in (1, "42", 2 ** 63 - 1)] == [1, 42, 2 ** 63 - 1]
    assert [row_id_of(v) for v in (0, -1, 2 ** 63, "²", "١٢", "9" * 5000, True, 1.5)] == \
        [None] * 8
