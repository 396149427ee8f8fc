"""ValueIndex on real databases: the library fixture, the demo bookshop, synthetic scale."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import sqlite3
import time
from pathlib import Path

import pytest

from agentflow.retrieval import ValueIndex, ValueMatch
from agentflow.retrieval import values as values_mod
from agentflow.sql import Database


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("AGENTFLOW_CACHE", str(cache))
    return cache


@pytest.fixture(scope="module")
def demo_db() -> Database:
    from agentflow.datasets.demo import build_demo

    with Database.open(build_demo().sqlite) as db:
        yield db


@pytest.fixture
def library(library_db: Path) -> Database:
    with Database.open(library_db) as db:
        yield db


def _top(index: ValueIndex, keyword: str, k: int = 5) -> list[ValueMatch]:
    return index.lookup([keyword], k=k)


def test_indexes_text_columns_and_skips_keys_and_dates(library: Database) -> None:
    index = ValueIndex.build(library, cache=False)
    assert set(index.columns) == {("author", "name"), ("author", "country"), ("book", "title")}
    assert index.skipped["loan.loaned_on"] == "date/time values"
    assert index.skipped["loan.returned_on"] == "date/time values"


def test_exact_case_and_accent_insensitive(library: Database) -> None:
    index = ValueIndex.build(library, cache=False)
    for keyword in ("Italo Calvino", "italo calvino", "ITALO  CALVINO", "Italo Calvino!"):
        best = _top(index, keyword)[0]
        assert (best.table, best.column, best.value, best.score) == \
            ("author", "name", "Italo Calvino", 1.0)
        assert best.keyword == keyword.strip()
    accented = ValueIndex.from_values({("t", "c"): ["Café Müller", "Cafe Central"]})
    assert _top(accented, "cafe muller")[0].value == "Café Müller"
    assert _top(accented, "cafe muller")[0].score == 1.0


def test_partial_names_substrings_and_typos(library: Database) -> None:
    index = ValueIndex.build(library, cache=False)
    assert _top(index, "Calvino")[0].value == "Italo Calvino"          # partial name
    assert _top(index, "Earthsea")[0].value == "A Wizard of Earthsea"   # word inside a title
    assert _top(index, "Calvno")[0].value == "Italo Calvino"            # typo
    assert _top(index, "Dispossesed")[0].value == "The Dispossessed"    # typo in a title
    assert _top(index, "Lispect")[0].value == "Clarice Lispector"       # prefix
    assert _top(index, "Invisible Cities")[0].score == 1.0
    best = _top(index, "Calvino")[0]
    assert 0.45 <= best.score < 1.0


def test_exact_beats_partial_and_ranking_is_deterministic() -> None:
    index = ValueIndex.from_values({
        ("stores", "city"): ["Porto", "Lisbon"],
        ("customers", "city"): ["Porto", "Braga"],
        ("books", "title"): ["The Porto Murders", "Murder in Porto"],
    })
    matches = index.lookup(["Porto"], k=4)
    assert [(m.table, m.value, m.score) for m in matches[:2]] == \
        [("customers", "Porto", 1.0), ("stores", "Porto", 1.0)]
    assert {m.value for m in matches[2:]} == {"The Porto Murders", "Murder in Porto"}
    assert matches == index.lookup(["Porto"], k=4)


def test_numbers_match_only_whole_values() -> None:
    index = ValueIndex.from_values({("cars", "make"): ["audi 4000", "4000", "32.3"]})
    assert [m.value for m in index.lookup(["4000"])] == ["4000"]
    assert index.lookup(["3"]) == []


def test_several_keywords_merge_and_keep_best_score(library: Database) -> None:
    index = ValueIndex.build(library, cache=False)
    matches = index.lookup(["Calvino", "Italo Calvino", "Italy", ""], k=3)
    calvino = [m for m in matches if m.value == "Italo Calvino"]
    assert len(calvino) == 1 and calvino[0].score == 1.0 and calvino[0].keyword == "Italo Calvino"
    assert any(m.value == "Italy" and m.column == "country" for m in matches)
    scores = [m.score for m in matches]
    assert scores == sorted(scores, reverse=True)
    assert index.lookup([]) == [] and index.lookup(["zzzzqqq"]) == []


def test_long_values_and_cap_per_column(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (note_id INTEGER PRIMARY KEY, body TEXT, tag TEXT)")
    rows = [(i, "long text " * 30 if i % 2 else f"short {i}", f"tag{i % 7}") for i in range(50)]
    rows.append((100, "rare", "tag0"))
    con.executemany("INSERT INTO notes VALUES (?, ?, ?)", rows)
    con.commit()
    con.close()
    with Database.open(path) as db:
        index = ValueIndex.build(db, cache=False, max_value_len=50, max_values_per_column=3)
    per_column: dict[tuple[str, str], list[str]] = {}
    for text, col in zip(index.arrays.entry_text, index.arrays.entry_col):
        per_column.setdefault(index.columns[int(col)], []).append(text)
    # most frequent first (tag0: 9 rows), ties by value (tag1..tag6: 7 rows each)
    assert sorted(per_column[("notes", "tag")]) == ["tag0", "tag1", "tag2"]
    assert all(len(v) <= 50 for v in per_column[("notes", "body")])
    assert index.lookup(["tag0"])[0].value == "tag0"


def test_disk_cache_reused_and_invalidated(tmp_path: Path, library_db: Path,
                                           _private_cache: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with Database.open(library_db) as db:
        first = ValueIndex.build(db)
    files = list((_private_cache / "values").glob("*.npz"))
    assert len(files) == 1
    real_collect = values_mod.collect_values

    def refuse(*args, **kwargs):
        raise AssertionError("should have been loaded from the cache")

    monkeypatch.setattr(values_mod, "collect_values", refuse)
    with Database.open(library_db) as db:
        again = ValueIndex.build(db)
    assert again.lookup(["Calvino"]) == first.lookup(["Calvino"])
    assert again.skipped == first.skipped
    # the file changes (size + mtime): the index is rebuilt, not served stale
    monkeypatch.setattr(values_mod, "collect_values", real_collect)
    con = sqlite3.connect(library_db)
    con.execute("INSERT INTO author VALUES (4, 'Jorge Luis Borges', 'Argentina')")
    con.commit()
    con.close()
    os.utime(library_db, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    with Database.open(library_db) as db:
        rebuilt = ValueIndex.build(db)
    assert rebuilt.lookup(["Borges"])[0].value == "Jorge Luis Borges"
    assert len(list((_private_cache / "values").glob("*.npz"))) == 2


def test_corrupt_cache_file_is_rebuilt(library_db: Path, _private_cache: Path) -> None:
    with Database.open(library_db) as db:
        ValueIndex.build(db)
        (cache_file,) = (_private_cache / "values").glob("*.npz")
        cache_file.write_bytes(b"not a numpy file")
        assert ValueIndex.build(db).lookup(["Calvino"])[0].value == "Italo Calvino"


def _build_in_child(path: str, cache: str) -> int:
    os.environ["AGENTFLOW_CACHE"] = cache
    with Database.open(path) as db:
        return ValueIndex.build(db).size


def test_concurrent_builders_leave_one_complete_file(library_db: Path,
                                                     _private_cache: Path) -> None:
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        sizes = pool.starmap(_build_in_child, [(str(library_db), str(_private_cache))] * 4)
    assert len(set(sizes)) == 1 and sizes[0] > 0
    folder = _private_cache / "values"
    assert [p.suffix for p in folder.iterdir()] == [".npz"]  # no temporary files left
    with Database.open(library_db) as db:
        assert ValueIndex.build(db).size == sizes[0]


def test_for_database_caches_in_process(library_db: Path) -> None:
    with Database.open(library_db) as db:
        a = ValueIndex.for_database(db)
        b = ValueIndex.for_database(db)
    assert a is b


def test_demo_database_values(demo_db: Database) -> None:
    index = ValueIndex.for_database(demo_db)
    porto = {(m.table, m.column) for m in index.lookup(["Porto"], k=5) if m.score == 1.0}
    assert porto == {("stores", "city"), ("customers", "city")}
    assert index.lookup(["Chiado Books"])[0].value == "Chiado Books"
    assert index.lookup(["Kreuzberg"])[0].value == "Kreuzberg Books"
    assert index.lookup(["Lisbn"])[0].value == "Lisbon"
    assert index.lookup(["Murder in Sintra"])[0].column == "title"
    assert not any(c.endswith("_id") for _, c in index.columns)


def test_demo_duckdb_copy_indexes_the_same_values(demo_db: Database) -> None:
    from agentflow.datasets.demo import build_demo

    with Database.open(build_demo().duckdb) as duck:
        index = ValueIndex.build(duck, cache=False)
    assert set(index.columns) == set(ValueIndex.for_database(demo_db).columns)
    assert index.lookup(["Ciara Murphy"])[0].value == "Ciara Murphy"


def _synthetic(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    syl = ["ka", "lo", "mi", "ne", "ra", "to", "vi", "sa", "de", "an", "el", "or", "us", "ph",
           "st", "ch", "ber", "lin", "ton", "son"]

    def word() -> str:
        return "".join(rng.choice(syl) for _ in range(rng.randint(2, 4))).capitalize()

    firsts = [word() for _ in range(3000)]
    lasts = [word() for _ in range(20000)]
    out: set[str] = set()
    while len(out) < n:
        if rng.random() < 0.7:
            out.add(f"{rng.choice(firsts)} {rng.choice(lasts)}")
        else:
            out.add(" ".join(word() for _ in range(rng.randint(1, 4))))
    return sorted(out)


def _at_scale(n: int) -> tuple[float, float, float]:
    """(share of keywords found, build seconds, lookup ms per keyword) over ``n`` values."""
    values = _synthetic(n)
    start = time.perf_counter()
    index = ValueIndex.from_values({("people", "name"): values})
    build_s = time.perf_counter() - start
    rng = random.Random(1)
    targets = [rng.choice(values) for _ in range(100)]
    keywords = []
    for t in targets:
        longest = max(t.split(), key=len)
        typo = t.replace(longest, longest[:3] + longest[4:])
        keywords.append((t.lower(), t))
        keywords.append((typo, t))
    start = time.perf_counter()
    found = sum(any(m.value == want for m in index.lookup([kw], k=10)) for kw, want in keywords)
    lookup_ms = (time.perf_counter() - start) * 1000 / len(keywords)
    return found / len(keywords), build_s, lookup_ms


def test_scale_100k_values_are_found() -> None:
    found, _, _ = _at_scale(100_000)
    assert found >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize("n", [100_000, 300_000])
def test_build_grows_linearly_and_lookup_stays_flat(n: int) -> None:
    """Measured side by side against 10x fewer values: building is about linear in the
    values (10x at 10x the values; measured ~15x at 100k), a lookup does not grow with them
    (measured ~1x, ~2 ms per keyword); the bounds leave room for a shared machine."""
    small = [_at_scale(n // 10) for _ in range(2)]  # best of two: the machine is shared
    large = [_at_scale(n) for _ in range(2)]
    assert min(f for f, _, _ in small + large) >= 0.9
    build = min(b for _, b, _ in large) / min(b for _, b, _ in small)
    lookup = min(m for _, _, m in large) / min(m for _, _, m in small)
    assert build < 40 and lookup < 5, (build, lookup)  # linear: 10 and 10; quadratic: 100
