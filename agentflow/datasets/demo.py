"""The project's own demo database, ``bookshop``: built here, deterministically, from a seed.

A fresh machine has no Spider or BIRD download, yet the embedded default and the tests need a
realistic multi-table database with questions whose answers are known. So the data is generated
from ``random.Random(seed)`` alone (no clock, no hash-order dependence): the same seed gives the
same content on every machine, which is what lets ``databases/demo/questions.json`` carry gold
SQL that was checked once and stays right.

The output is laid out like Spider (``database/<db>/<db>.sqlite``, ``tables.json``,
``dev.json``) plus the DuckDB copy in ``duckdb/<db>/<db>.duckdb``, so the generic loaders read
it as just another benchmark.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import itertools
import json
import os
import random
import shutil
import sqlite3
import tempfile
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

DEMO_DB_ID = "bookshop"

# Bump when the generator changes what it writes, so stale builds are rebuilt.
BUILDER_VERSION = 1

_REPO = Path(__file__).resolve().parents[2]
DEMO_SOURCE_DIR = _REPO / "databases" / "demo"
DEFAULT_OUT_DIR = DEMO_SOURCE_DIR / "build"
SCHEMA_FILE = DEMO_SOURCE_DIR / "schema.sql"
QUESTIONS_FILE = DEMO_SOURCE_DIR / "questions.json"
# Chess-pipeline queries on this database, recorded by ``agentflow eval --dataset demo`` with
# the embedded model: what ``agentflow simulate`` replays when given no trace (its README
# says how it was made).
TRACE_FILE = DEMO_SOURCE_DIR / "trace.jsonl"

_MANIFEST = "build.json"

# The data is a snapshot taken at the end of 2024; nothing may happen after it.
_START = dt.date(2021, 1, 1)
_END = dt.date(2024, 12, 31)


@dataclass(frozen=True)
class DemoPaths:
    """Where one build lives. ``root`` is a Spider-layout dataset folder."""

    root: Path
    sqlite: Path
    duckdb: Path
    tables: Path
    questions: Path


def demo_paths(out_dir: str | Path | None = None) -> DemoPaths:
    """The paths a build into ``out_dir`` has (or will have); builds nothing."""
    root = Path(out_dir) if out_dir is not None else DEFAULT_OUT_DIR
    return DemoPaths(
        root=root,
        sqlite=root / "database" / DEMO_DB_ID / f"{DEMO_DB_ID}.sqlite",
        duckdb=root / "duckdb" / DEMO_DB_ID / f"{DEMO_DB_ID}.duckdb",
        tables=root / "tables.json",
        questions=root / "dev.json",
    )


def demo_questions() -> list[dict]:
    """The committed questions: ``question``, ``query`` (SQLite dialect), ``difficulty``."""
    return json.loads(QUESTIONS_FILE.read_text(encoding="utf-8"))


def build_demo(out_dir: str | Path | None = None, *, seed: int = 7,
               force: bool = False) -> DemoPaths:
    """Build the demo dataset into ``out_dir`` unless an up-to-date build is already there.

    A build is up to date when its manifest records the same seed, builder version and input
    files (schema, questions). Everything is built in a private temporary folder and moved into
    place with ``os.replace``, manifest last, so a crash never leaves a half-written file nor a
    mixed build that looks finished. Concurrent builders are serialised by a lock file where the
    OS supports it; without one, builds being deterministic, a race still yields consistent files.
    """
    paths = demo_paths(out_dir)
    paths.root.mkdir(parents=True, exist_ok=True)
    inputs = _inputs_fingerprint(seed)
    with _build_lock(paths.root / ".build.lock"):
        if not force and _is_up_to_date(paths, inputs):
            return paths
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=paths.root))
        try:
            manifest = _build_into(tmp, seed=seed, inputs=inputs)
            # Without a manifest a crash between the replaces below reads as "not built".
            (paths.root / _MANIFEST).unlink(missing_ok=True)
            for produced, final in ((tmp / "db.sqlite", paths.sqlite),
                                    (tmp / "db.duckdb", paths.duckdb),
                                    (tmp / "tables.json", paths.tables),
                                    (tmp / "dev.json", paths.questions)):
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(produced, final)
            _write_atomic(paths.root / _MANIFEST, json.dumps(manifest, indent=2) + "\n")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return paths


def content_hash(sqlite_path: Path) -> str:
    """SHA-256 of a database's schema and rows in key order: equal content, equal hash.

    File bytes are not comparable across builds (page layout, SQLite version), content is.
    """
    digest = hashlib.sha256()
    conn = sqlite3.connect(f"file:{Path(sqlite_path).resolve()}?mode=ro", uri=True)
    try:
        tables = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' "
                              "AND name NOT LIKE 'sqlite_%' ORDER BY name").fetchall()
        for name, sql in tables:
            digest.update(f"{name}\n{sql}\n".encode())
            for row in conn.execute(f'SELECT * FROM "{name}" ORDER BY 1'):
                digest.update(repr(row).encode())
                digest.update(b"\n")
    finally:
        conn.close()
    return digest.hexdigest()


# ------------------------------------------------------------------------------- build steps
def _build_into(tmp: Path, *, seed: int, inputs: str) -> dict:
    from agentflow.datasets.to_duckdb import convert_sqlite_to_duckdb

    sqlite_path = tmp / "db.sqlite"
    rows = _write_sqlite(sqlite_path, generate(seed))
    tables_entry = spider_tables_entry(sqlite_path, DEMO_DB_ID)
    _write_atomic(tmp / "tables.json", json.dumps([tables_entry], indent=2) + "\n")
    dev = [{"db_id": DEMO_DB_ID, "question": q["question"], "query": q["query"],
            "difficulty": q["difficulty"]} for q in demo_questions()]
    _write_atomic(tmp / "dev.json", json.dumps(dev, indent=2, ensure_ascii=False) + "\n")
    report = convert_sqlite_to_duckdb(sqlite_path, tmp / "db.duckdb")
    return {"db_id": DEMO_DB_ID, "seed": seed, "builder_version": BUILDER_VERSION,
            "inputs": inputs, "content_hash": content_hash(sqlite_path), "rows": rows,
            "duckdb_notes": report.notes + [n for t in report.tables for n in t.notes]}


def _write_sqlite(path: Path, data: dict[str, list[tuple]]) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.executescript(SCHEMA_FILE.read_text(encoding="utf-8"))
        for table, rows in data.items():
            marks = ", ".join("?" * len(rows[0]))
            conn.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        conn.commit()
        problems = conn.execute("PRAGMA foreign_key_check").fetchall()
        if problems:
            raise RuntimeError(f"demo data violates foreign keys: {problems[:5]}")
    finally:
        conn.close()
    return {table: len(rows) for table, rows in data.items()}


def _inputs_fingerprint(seed: int) -> str:
    digest = hashlib.sha256(f"{BUILDER_VERSION}:{seed}:".encode())
    for path in (SCHEMA_FILE, QUESTIONS_FILE):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _is_up_to_date(paths: DemoPaths, inputs: str) -> bool:
    manifest = paths.root / _MANIFEST
    if not manifest.is_file():
        return False
    try:
        recorded = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    files = (paths.sqlite, paths.duckdb, paths.tables, paths.questions)
    return recorded.get("inputs") == inputs and all(p.is_file() for p in files)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (POSIX); a no-op where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # Windows: atomic replaces of deterministic files are enough
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ------------------------------------------------------------------------------- tables.json
_SPIDER_TYPES = (("INT", "number"), ("REAL", "number"), ("FLOA", "number"), ("DOUB", "number"),
                 ("NUM", "number"), ("DATE", "time"), ("TIME", "time"), ("CHAR", "text"),
                 ("TEXT", "text"), ("CLOB", "text"))


def spider_tables_entry(sqlite_path: Path, db_id: str) -> dict:
    """The Spider ``tables.json`` entry for a SQLite file, read from the file itself."""
    conn = sqlite3.connect(f"file:{Path(sqlite_path).resolve()}?mode=ro", uri=True)
    try:
        tables = [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY rowid")]
        columns: list[list] = [[-1, "*"]]
        types = ["text"]
        index: dict[tuple[str, str], int] = {}
        primary: list[int] = []
        for t_idx, table in enumerate(tables):
            for _cid, name, declared, _nn, _default, pk in conn.execute(
                    f'PRAGMA table_info("{table}")'):
                index[(table.lower(), name.lower())] = len(columns)
                if pk:
                    primary.append(len(columns))
                columns.append([t_idx, name])
                types.append(_spider_type(declared))
        foreign: list[list[int]] = []
        for table in tables:
            for row in conn.execute(f'PRAGMA foreign_key_list("{table}")'):
                ref_table, col, ref_col = row[2], row[3], row[4]
                foreign.append([index[(table.lower(), col.lower())],
                                index[(ref_table.lower(), ref_col.lower())]])
    finally:
        conn.close()
    return {
        "db_id": db_id,
        "table_names_original": tables,
        "table_names": [_natural(t) for t in tables],
        "column_names_original": columns,
        "column_names": [[t, name if t < 0 else _natural(name)] for t, name in columns],
        "column_types": types,
        "primary_keys": primary,
        "foreign_keys": foreign,
    }


def _spider_type(declared: str) -> str:
    upper = (declared or "").upper()
    for key, kind in _SPIDER_TYPES:
        if key in upper:
            return kind
    return "others"


def _natural(name: str) -> str:
    return name.replace("_", " ").lower()


# ------------------------------------------------------------------------------- vocabulary
# Per country: (cities with a weight, first names, last names, language, phone prefix).
_COUNTRIES: dict[str, dict] = {
    "Portugal": {
        "cities": (("Lisbon", 10), ("Porto", 7), ("Coimbra", 2), ("Braga", 2), ("Faro", 1)),
        "first": ("João", "Maria", "Ana", "Pedro", "Inês", "Tiago", "Beatriz", "Rui", "Sofia",
                  "Miguel", "Catarina", "Diogo", "Mariana", "Nuno", "Joana", "Ricardo", "Teresa",
                  "Francisco", "Leonor", "Gonçalo", "Rita", "Bruno", "Carolina", "Hugo"),
        "last": ("Silva", "Santos", "Ferreira", "Pereira", "Oliveira", "Costa", "Rodrigues",
                 "Martins", "Sousa", "Fernandes", "Gonçalves", "Gomes", "Lopes", "Marques",
                 "Almeida", "Ribeiro", "Pinto", "Carvalho", "Teixeira", "Moreira", "Correia",
                 "Mendes", "Nunes", "Vieira"),
        "language": "Portuguese", "phone": "+351 9"},
    "Spain": {
        "cities": (("Madrid", 8), ("Barcelona", 7), ("Seville", 2), ("Valencia", 2)),
        "first": ("Lucía", "Javier", "Carmen", "Pablo", "Elena", "Alejandro", "Laura", "Daniel",
                  "Paula", "Sergio", "Carlos", "Alba", "Manuel", "Irene", "Raúl", "Nuria",
                  "Marta", "Adrián", "Cristina", "Álvaro"),
        "last": ("García", "Martínez", "López", "Sánchez", "González", "Pérez", "Romero",
                 "Navarro", "Torres", "Ruiz", "Díaz", "Moreno", "Muñoz", "Álvarez", "Jiménez",
                 "Castro", "Ortega", "Rubio", "Molina", "Delgado"),
        "language": "Spanish", "phone": "+34 6"},
    "France": {
        "cities": (("Paris", 9), ("Lyon", 5), ("Marseille", 2), ("Toulouse", 2)),
        "first": ("Camille", "Louis", "Chloé", "Hugo", "Léa", "Thomas", "Manon", "Nicolas",
                  "Julie", "Antoine", "Emma", "Julien", "Claire", "Mathieu", "Élise", "Pierre"),
        "last": ("Martin", "Bernard", "Dubois", "Robert", "Richard", "Petit", "Durand", "Leroy",
                 "Moreau", "Simon", "Laurent", "Lefebvre", "Michel", "Fontaine", "Girard",
                 "Bonnet"),
        "language": "French", "phone": "+33 6"},
    "Germany": {
        "cities": (("Berlin", 8), ("Munich", 6), ("Hamburg", 2), ("Cologne", 2)),
        "first": ("Lukas", "Anna", "Jonas", "Lena", "Felix", "Maximilian", "Hannah", "Paul",
                  "Jan", "Katharina", "Tobias", "Julia", "Stefan", "Sabine", "Moritz", "Greta"),
        "last": ("Müller", "Schmidt", "Schneider", "Fischer", "Weber", "Meyer", "Wagner",
                 "Becker", "Schulz", "Hoffmann", "Koch", "Richter", "Klein", "Wolf", "Neumann",
                 "Braun"),
        "language": "German", "phone": "+49 15"},
    "Netherlands": {
        "cities": (("Amsterdam", 6), ("Rotterdam", 2), ("Utrecht", 2)),
        "first": ("Daan", "Sanne", "Bram", "Lotte", "Sem", "Fleur", "Lars", "Eva", "Thijs",
                  "Anouk", "Ruben", "Femke", "Jesse", "Iris", "Koen", "Maaike"),
        "last": ("de Jong", "Jansen", "de Vries", "van den Berg", "van Dijk", "Bakker",
                 "Janssen", "Visser", "Smit", "Meijer", "de Boer", "Mulder", "de Groot", "Bos",
                 "Vos", "Peters"),
        "language": "Dutch", "phone": "+31 6"},
    "Ireland": {
        "cities": (("Dublin", 6), ("Cork", 2), ("Galway", 1)),
        "first": ("Aoife", "Conor", "Siobhan", "Cian", "Niamh", "Sean", "Ciara", "Padraig",
                  "Roisin", "Eoin", "Aisling", "Declan", "Grainne", "Fionn", "Orla", "Liam"),
        "last": ("Murphy", "Kelly", "O'Sullivan", "Walsh", "O'Brien", "Byrne", "Ryan",
                 "O'Connor", "O'Neill", "Reilly", "Doyle", "McCarthy", "Gallagher", "Doherty",
                 "Kennedy", "Lynch"),
        "language": "English", "phone": "+353 8"},
    "Italy": {
        "cities": (("Milan", 5), ("Rome", 4), ("Turin", 2)),
        "first": ("Giulia", "Marco", "Francesca", "Alessandro", "Chiara", "Luca", "Sara",
                  "Matteo", "Valentina", "Andrea", "Elisa", "Davide", "Federica", "Simone",
                  "Martina", "Giorgio"),
        "last": ("Rossi", "Russo", "Ferrari", "Esposito", "Bianchi", "Romano", "Colombo",
                 "Ricci", "Marino", "Greco", "Bruno", "Gallo", "Conti", "De Luca", "Mancini",
                 "Rinaldi"),
        "language": "Italian", "phone": "+39 3"},
}
# Authors also come from countries the chain has no shop in.
_AUTHOR_ONLY_COUNTRIES: dict[str, dict] = {
    "United Kingdom": {
        "first": ("Oliver", "Emily", "Harry", "Charlotte", "George", "Amelia", "James", "Olivia",
                  "William", "Grace", "Henry", "Alice", "Edward", "Florence", "Arthur", "Eleanor"),
        "last": ("Whitfield", "Ashworth", "Hartley", "Pemberton", "Blackwood", "Thornton",
                 "Holloway", "Carrington", "Lockwood", "Sinclair", "Hawthorne", "Ellison",
                 "Marlowe", "Winslow", "Kendall", "Fairfax"),
        "language": "English"},
    "United States": {
        "first": ("Ethan", "Madison", "Noah", "Abigail", "Mason", "Harper", "Logan", "Avery",
                  "Caleb", "Savannah", "Wyatt", "Brooke", "Dylan", "Morgan", "Austin", "Hailey"),
        "last": ("Carter", "Mitchell", "Brooks", "Hayes", "Reed", "Coleman", "Bennett", "Foster",
                 "Sullivan", "Porter", "Griffin", "Hughes", "Russell", "Barnes", "Fisher",
                 "Palmer"),
        "language": "English"},
}
_CUSTOMER_COUNTRY_WEIGHTS = (("Portugal", 30), ("Spain", 18), ("France", 15), ("Germany", 14),
                             ("Netherlands", 8), ("Ireland", 7), ("Italy", 8))
_AUTHOR_COUNTRY_WEIGHTS = (("United Kingdom", 18), ("United States", 16), ("Portugal", 12),
                           ("Spain", 10), ("France", 12), ("Germany", 10), ("Italy", 9),
                           ("Netherlands", 6), ("Ireland", 7))

# (name, city, country, opened, floor area in m2)
_STORES = (
    ("Chiado Books", "Lisbon", "Portugal", "2009-04-18", 420),
    ("Ribeira Books", "Porto", "Portugal", "2011-09-03", 310),
    ("Malasaña Books", "Madrid", "Spain", "2013-05-21", 380),
    ("Gràcia Books", "Barcelona", "Spain", "2014-10-11", 290),
    ("Marais Books", "Paris", "France", "2012-02-07", 450),
    ("Croix-Rousse Books", "Lyon", "France", "2016-06-25", 240),
    ("Kreuzberg Books", "Berlin", "Germany", "2015-03-14", 360),
    ("Schwabing Books", "Munich", "Germany", "2018-11-02", 270),
    ("Jordaan Books", "Amsterdam", "Netherlands", "2017-08-19", 230),
    ("Temple Bar Books", "Dublin", "Ireland", "2019-04-06", 260),
    ("Alvalade Books", "Lisbon", "Portugal", "2020-01-15", 210),
    ("Brera Books", "Milan", "Italy", "2022-05-14", 330),
)

# (genre, weight, pages range, base price)
_GENRES = (
    ("Fiction", 22, (180, 520), 17.0), ("Mystery", 12, (220, 460), 15.0),
    ("Science Fiction", 7, (240, 560), 16.0), ("Fantasy", 8, (300, 720), 18.0),
    ("Romance", 8, (200, 400), 13.0), ("History", 8, (260, 680), 24.0),
    ("Biography", 5, (240, 560), 22.0), ("Science", 7, (200, 420), 21.0),
    ("Cookery", 6, (160, 320), 27.0), ("Travel", 5, (180, 340), 19.0),
    ("Children", 7, (32, 160), 10.0), ("Poetry", 3, (64, 160), 12.0),
    ("Business", 4, (200, 360), 23.0), ("Self-Help", 4, (180, 300), 16.0),
)

_ADJ = ("Silent", "Last", "Hidden", "Distant", "Golden", "Broken", "Quiet", "Winter", "Burning",
        "Forgotten", "Crimson", "Endless", "Salt", "Paper", "Midnight", "Glass", "Wild", "Little",
        "Lost", "Northern", "Pale", "Secret", "Restless", "Hollow", "Bright", "Iron", "Summer",
        "Autumn", "Lonely", "Second")
_NOUN = ("Harbour", "Garden", "River", "Orchard", "Lighthouse", "Letter", "House", "Island",
         "Station", "Bridge", "Mirror", "Daughter", "Voyage", "Kingdom", "Archive", "Clockmaker",
         "Cartographer", "Tide", "Shore", "Forest", "Promise", "Season", "Window", "Library",
         "Vineyard", "Compass", "Lantern", "Map", "Witness", "Ferry")
_PLACE = ("Lisbon", "Porto", "Venice", "Vienna", "Prague", "Tangier", "Alexandria", "Trieste",
          "Sintra", "the Algarve", "Galicia", "Provence", "Bavaria", "Tuscany", "Connemara",
          "the Azores", "Madeira", "Andalusia", "Flanders", "Sicily", "Brittany", "the Alps")
_REGION = ("Iberia", "the Mediterranean", "the Atlantic", "Europe", "the Baltic", "the Balkans",
           "Portugal", "Spain", "Ireland", "the Low Countries", "Italy", "the Rhine")
_AGE = ("Sail", "Steam", "Print", "Empire", "Revolution", "Reason", "Discovery", "Silk")
_CRIME = ("Murders", "Affair", "Mystery", "Case", "Conspiracy", "Disappearance")
_FPLACE = ("Eldmoor", "Varrow", "Kharis", "Valdren", "Morrowgate", "Ashvale", "Thornhold",
           "Silvermere", "Duskwater", "Ironwood", "Greyhaven", "Emberfall")
_STAR = ("Proxima", "Vega", "Tau Ceti", "Altair", "Sirius", "Andromeda", "Europa", "Titan",
         "Ganymede", "Kepler", "Orion", "Cassini")
_GREEK = ("Alpha", "Sigma", "Omega", "Delta", "Zeta", "Theta", "Kappa", "Lambda")
_TOPIC = ("Sleep", "Memory", "Bees", "Clouds", "Volcanoes", "Light", "Time", "Oceans", "Numbers",
          "Forests", "Stars", "Genes", "Bacteria", "Rivers", "Glaciers", "Mushrooms", "Birdsong",
          "Coral Reefs")
_CUISINE = ("Portuguese", "Spanish", "Italian", "French", "Basque", "Sicilian", "Moroccan",
            "Japanese", "Greek", "Lebanese", "Nordic", "Vegetarian", "Irish", "Provençal")
_INGREDIENT = ("Olive Oil", "Lemons", "Rice", "Tomatoes", "Fish", "Bread", "Chocolate", "Spices",
               "Beans", "Mushrooms", "Cheese", "Herbs")
_ANIMAL = ("Fox", "Owl", "Hedgehog", "Whale", "Dragon", "Bear", "Penguin", "Rabbit", "Octopus",
           "Badger", "Tortoise", "Mouse")
_PET_NAME = ("Pip", "Maisie", "Otto", "Lola", "Bruno", "Tilly", "Figo", "Nina", "Toby", "Zeca")
_BUSINESS_ADJ = ("Lean", "Patient", "Curious", "Resilient", "Quiet", "Remote", "Honest",
                 "Agile", "Small", "Generous")
_BUSINESS_NOUN = ("Company", "Manager", "Leader", "Startup", "Team", "Founder")
_SKILL = ("Slowing Down", "Saying No", "Deep Work", "Listening", "Starting Over", "Letting Go",
          "Focus", "Rest", "Small Steps", "Everyday Courage")

_TITLE_TEMPLATES: dict[str, tuple[str, ...]] = {
    "Fiction": ("The {adj} {noun}", "The {noun} of {place}", "{adj} Days in {place}",
                "The {noun} and the {noun2}"),
    "Mystery": ("Death at the {noun}", "The {place} {crime}", "Murder in {place}",
                "The {adj} {crime}"),
    "Science Fiction": ("The {adj} Signal", "Beyond {star}", "Station {greek}",
                        "The {star} {noun}"),
    "Fantasy": ("The {adj} Crown of {fplace}", "The Dragon of {fplace}",
                "The {noun} of {fplace}", "{fplace} Rising"),
    "Romance": ("A Summer in {place}", "Letters from {place}", "The {place} Affair",
                "Love and the {adj} {noun}"),
    "History": ("A History of {region}", "{region} in the Age of {age}",
                "The {adj} Century of {region}", "Ships, Salt and {region}"),
    "Biography": ("{person}: A Life", "The Life of {person}", "Remembering {person}"),
    "Science": ("The Science of {topic}", "A Brief Guide to {topic}", "Why {topic} Matter",
                "The Secret Life of {topic}"),
    "Cookery": ("{cuisine} Home Cooking", "The {cuisine} Table", "Cooking with {ingredient}",
                "{cuisine} Kitchen: {ingredient}"),
    "Travel": ("Walking in {place}", "{place} on Foot", "The Road to {place}",
               "Slow Travel in {region}"),
    "Children": ("{pet} the {animal}", "The {adj} {animal}", "{pet} and the {noun}"),
    "Poetry": ("{adj} Hours", "Poems from the {noun}", "Songs of {place}"),
    "Business": ("The {badj} {bnoun}", "Becoming a {badj} {bnoun}",
                 "The {badj} Way to Grow"),
    "Self-Help": ("The Art of {skill}", "A Year of {skill}", "{skill} for Busy People"),
}

_COMMENTS = {
    "good": ("A gripping read from start to finish.",
             "Beautifully written, I could not put it down.",
             "One of the best books I have read this year.",
             "Lovely gift, arrived in perfect condition.",
             "Wonderful characters and a satisfying ending.",
             "Clear, useful and well organised.",
             "My children loved it.",
             "Bought a second copy for a friend."),
    "mixed": ("Good in parts but the middle drags.",
              "Decent, though not as good as the reviews suggest.",
              "Interesting ideas, uneven writing.",
              "Fine for a long train journey.",
              "The translation felt a little stiff."),
    "bad": ("Disappointing, I gave up halfway.",
            "Arrived with a damaged cover.",
            "Far too long for what it has to say.",
            "Not what I expected from the description.",
            "The print is very small and hard to read."),
}

# Yearly salary range in euros, by role.
_SALARY = {"Store Manager": (42000, 52000), "Assistant Manager": (34000, 40000),
           "Bookseller": (24000, 31000), "Cashier": (21000, 25000)}


# ------------------------------------------------------------------------------- generation
def generate(seed: int) -> dict[str, list[tuple]]:
    """Every table's rows, in schema order, from ``seed`` alone."""
    rng = random.Random(seed)
    stores = [(i + 1, *row) for i, row in enumerate(_STORES)]
    employees = _employees(rng, stores)
    authors = _authors(rng)
    books, popularity, quality = _books(rng, authors)
    customers, activity = _customers(rng)
    orders, items = _orders(rng, stores, employees, books, popularity, customers, activity)
    reviews = _reviews(rng, orders, items, quality)
    return {"stores": stores, "employees": employees, "authors": authors, "books": books,
            "customers": customers, "orders": orders, "order_items": items, "reviews": reviews}


def _weighted(rng: random.Random, pairs: Sequence[tuple[str, float]]) -> str:
    return rng.choices([p[0] for p in pairs], weights=[p[1] for p in pairs])[0]


def _day(rng: random.Random, lo: dt.date, hi: dt.date) -> dt.date:
    return lo + dt.timedelta(days=rng.randint(0, (hi - lo).days))


def _ascii(text: str) -> str:
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return "".join(ch for ch in folded.lower() if ch.isalnum())


def _employees(rng: random.Random, stores: list[tuple]) -> list[tuple]:
    rows: list[tuple] = []
    for store_id, _name, _city, country, opened, _area in stores:
        pool = _COUNTRIES[country]
        opened_day = dt.date.fromisoformat(opened)
        manager_id: int | None = None
        staff = [("Store Manager", 1), ("Assistant Manager", 1),
                 ("Bookseller", rng.randint(3, 6)), ("Cashier", rng.randint(1, 3))]
        for role, count in staff:
            lo, hi = _SALARY[role]
            for _ in range(count):
                employee_id = len(rows) + 1
                hired = opened_day if role == "Store Manager" else _day(
                    rng, opened_day, min(_END - dt.timedelta(days=60),
                                         opened_day + dt.timedelta(days=5 * 365)))
                salary = float(round(rng.uniform(lo, hi) / 100) * 100)
                rows.append((employee_id, rng.choice(pool["first"]), rng.choice(pool["last"]),
                             store_id, role, hired.isoformat(), salary,
                             None if role == "Store Manager" else manager_id))
                if role == "Store Manager":
                    manager_id = employee_id
    return rows


def _authors(rng: random.Random, count: int = 160) -> list[tuple]:
    rows: list[tuple] = []
    taken: set[str] = set()
    while len(rows) < count:
        country = _weighted(rng, _AUTHOR_COUNTRY_WEIGHTS)
        pool = _COUNTRIES.get(country) or _AUTHOR_ONLY_COUNTRIES[country]
        name = f"{rng.choice(pool['first'])} {rng.choice(pool['last'])}"
        if name in taken:
            continue
        taken.add(name)
        birth = rng.randint(1930, 1992) if rng.random() > 0.12 else None
        rows.append((len(rows) + 1, name, country, birth))
    return rows


def _title(rng: random.Random, genre: str) -> str:
    person_pool = _COUNTRIES[rng.choice(sorted(_COUNTRIES))]
    noun, noun2 = rng.sample(_NOUN, 2)
    return rng.choice(_TITLE_TEMPLATES[genre]).format(
        adj=rng.choice(_ADJ), noun=noun, noun2=noun2, place=rng.choice(_PLACE),
        region=rng.choice(_REGION), age=rng.choice(_AGE), crime=rng.choice(_CRIME),
        fplace=rng.choice(_FPLACE), star=rng.choice(_STAR), greek=rng.choice(_GREEK),
        topic=rng.choice(_TOPIC), cuisine=rng.choice(_CUISINE),
        ingredient=rng.choice(_INGREDIENT), animal=rng.choice(_ANIMAL),
        pet=rng.choice(_PET_NAME), badj=rng.choice(_BUSINESS_ADJ),
        bnoun=rng.choice(_BUSINESS_NOUN), skill=rng.choice(_SKILL),
        person=f"{rng.choice(person_pool['first'])} {rng.choice(person_pool['last'])}")


def _isbn13(rng: random.Random) -> str:
    digits = [9, 7, 8] + [rng.randint(0, 9) for _ in range(9)]
    check = (10 - sum(d * (1 if i % 2 == 0 else 3) for i, d in enumerate(digits)) % 10) % 10
    return "".join(map(str, digits + [check]))


def _books(rng: random.Random, authors: list[tuple],
           count: int = 650) -> tuple[list[tuple], list[float], dict[int, float]]:
    """Books, plus two hidden traits: how often each sells and how well it is liked."""
    genres = {g[0]: g for g in _GENRES}
    # Each author writes mostly in one genre; a few authors are far more prolific.
    author_genre = {a[0]: _weighted(rng, [(g[0], g[1]) for g in _GENRES]) for a in authors}
    author_weight = [rng.lognormvariate(0, 0.7) for _ in authors]
    rows: list[tuple] = []
    popularity: list[float] = []
    quality: dict[int, float] = {}
    titles: set[str] = set()
    isbns: set[str] = set()
    while len(rows) < count:
        author_id, _name, country, birth = rng.choices(authors, weights=author_weight)[0]
        genre = author_genre[author_id] if rng.random() < 0.8 else _weighted(
            rng, [(g[0], g[1]) for g in _GENRES])
        title, isbn = _title(rng, genre), _isbn13(rng)
        if title in titles or isbn in isbns:
            continue
        titles.add(title)
        isbns.add(isbn)
        _g, _w, (lo, hi), base = genres[genre]
        year = max(1955, 2024 - int(rng.expovariate(1 / 9)))
        if birth is not None:
            year = max(year, min(2024, birth + 22))
        pages = rng.randint(lo, hi)
        price = base + (pages - lo) / (hi - lo) * base * 0.6 + rng.uniform(-2, 3)
        price = max(4.99, round(price) - 0.01)
        native = (_COUNTRIES.get(country) or _AUTHOR_ONLY_COUNTRIES[country])["language"]
        language = native if rng.random() < 0.6 else "English"
        book_id = len(rows) + 1
        rows.append((book_id, title, author_id, genre, language, year,
                     None if rng.random() < 0.04 else pages, price, isbn))
        recency = 1.6 if year >= 2020 else 1.0
        popularity.append(rng.lognormvariate(0, 1.0) * recency)
        quality[book_id] = rng.uniform(2.6, 4.7)
    return rows, popularity, quality


def _customers(rng: random.Random, count: int = 1800) -> tuple[list[tuple], list[float]]:
    """Customers, plus how many orders a year each places on average (0 for some)."""
    rows: list[tuple] = []
    activity: list[float] = []
    emails: set[str] = set()
    for customer_id in range(1, count + 1):
        country = _weighted(rng, _CUSTOMER_COUNTRY_WEIGHTS)
        pool = _COUNTRIES[country]
        city = _weighted(rng, pool["cities"])
        first, last = rng.choice(pool["first"]), rng.choice(pool["last"])
        base = f"{_ascii(first)}.{_ascii(last)}"
        email, n = f"{base}@example.com", 1
        while email in emails:
            n += 1
            email = f"{base}{n}@example.com"
        emails.add(email)
        phone = None if rng.random() < 0.35 else pool["phone"] + "".join(
            str(rng.randint(0, 9)) for _ in range(9 - len(pool["phone"].split()[1])))
        signup = _day(rng, dt.date(2019, 1, 1), dt.date(2024, 11, 30))
        tier = _weighted(rng, (("", 45), ("Bronze", 30), ("Silver", 17), ("Gold", 8))) or None
        rows.append((customer_id, first, last, email, phone, city, country,
                     signup.isoformat(), tier))
        boost = {"Gold": 2.2, "Silver": 1.5, "Bronze": 1.1, None: 0.8}[tier]
        activity.append(0.0 if rng.random() < 0.08 else rng.gammavariate(1.3, 0.75) * boost)
    return rows, activity


def _orders(rng: random.Random, stores: list[tuple], employees: list[tuple], books: list[tuple],
            popularity: list[float], customers: list[tuple],
            activity: list[float]) -> tuple[list[tuple], list[tuple]]:
    book_weights = list(itertools.accumulate(popularity))
    stores_in_city: dict[str, list[tuple]] = {}
    for store in stores:
        stores_in_city.setdefault(store[2], []).append(store)
    staff: dict[int, list[tuple]] = {}
    for emp in employees:
        staff.setdefault(emp[3], []).append(emp)
    # Draw every order's customer and date first, then number them chronologically.
    drafts: list[tuple[dt.date, int, int]] = []
    for customer, rate in zip(customers, activity):
        first_day = max(_START, dt.date.fromisoformat(customer[7]))
        years = ((_END - first_day).days + 1) / 365.25
        expected = rate * years
        n = int(expected) + (1 if rng.random() < expected - int(expected) else 0)
        for _ in range(n):
            drafts.append((_day(rng, first_day, _END), customer[0], rng.getrandbits(32)))
    drafts.sort()
    orders: list[tuple] = []
    items: list[tuple] = []
    for order_id, (day, customer_id, _tiebreak) in enumerate(drafts, start=1):
        customer = customers[customer_id - 1]
        local = [s for s in stores_in_city.get(customer[5], [])
                 if dt.date.fromisoformat(s[4]) <= day]
        in_store = rng.random() < (0.55 if local else 0.06)
        if in_store:
            store = rng.choice(local) if local else rng.choice(
                [s for s in stores if dt.date.fromisoformat(s[4]) <= day])
            sellers = [e for e in staff[store[0]]
                       if e[4] != "Store Manager" and dt.date.fromisoformat(e[5]) <= day]
            seller = rng.choice(sellers) if sellers else staff[store[0]][0]
            status = "returned" if rng.random() < 0.03 else "completed"
            store_id, employee_id, shipped = store[0], seller[0], None
        else:
            store_id = employee_id = None
            status, shipped = _online_status(rng, day)
        tier = customer[8]
        discount_chance = {"Gold": 0.45, "Silver": 0.25, "Bronze": 0.15, None: 0.08}[tier]
        discount = (_weighted(rng, (("0.05", 4), ("0.1", 4), ("0.15", 2), ("0.2", 1)))
                    if rng.random() < discount_chance else None)
        orders.append((order_id, customer_id, "in store" if in_store else "online", store_id,
                       employee_id, day.isoformat(), status,
                       shipped.isoformat() if shipped else None,
                       float(discount) if discount else None))
        lines = _weighted(rng, (("1", 50), ("2", 28), ("3", 13), ("4", 6), ("5", 3)))
        chosen: list[int] = []
        while len(chosen) < int(lines):
            book = rng.choices(books, cum_weights=book_weights)[0]
            if book[5] > day.year or book[0] in chosen:
                continue
            chosen.append(book[0])
            quantity = int(_weighted(rng, (("1", 80), ("2", 15), ("3", 5))))
            items.append((len(items) + 1, order_id, book[0], quantity, book[7]))
    return orders, items


def _online_status(rng: random.Random, day: dt.date) -> tuple[str, dt.date | None]:
    age = (_END - day).days
    if age <= 2:
        return "processing", None
    shipped = day + dt.timedelta(days=rng.randint(1, min(4, age)))
    if age <= 9:
        return "shipped", shipped
    roll = rng.random()
    if roll < 0.05:
        return "cancelled", None
    if roll < 0.09:
        return "returned", shipped
    return "delivered", shipped


def _reviews(rng: random.Random, orders: list[tuple], items: list[tuple],
             quality: dict[int, float]) -> list[tuple]:
    """Some buyers review what they received, a few days to weeks after receiving it."""
    received = {o[0]: dt.date.fromisoformat(o[7] or o[5]) for o in orders
                if o[6] in ("completed", "delivered")}
    customer_of = {o[0]: o[1] for o in orders}
    rows: list[tuple] = []
    reviewed: set[tuple[int, int]] = set()
    for _item_id, order_id, book_id, _qty, _price in items:
        if order_id not in received or rng.random() >= 0.3:
            continue
        key = (customer_of[order_id], book_id)
        day = received[order_id] + dt.timedelta(days=rng.randint(2, 60))
        if key in reviewed or day > _END:
            continue
        reviewed.add(key)
        rating = min(5, max(1, round(rng.gauss(quality[book_id], 0.9))))
        comment = None
        if rng.random() < 0.6:
            mood = "good" if rating >= 4 else "mixed" if rating == 3 else "bad"
            comment = rng.choice(_COMMENTS[mood])
        rows.append((day.isoformat(), key[0], book_id, rating, comment))
    rows.sort(key=lambda r: r[:3])  # review ids follow time, like an append-only table
    return [(i, book_id, customer_id, rating, day, comment)
            for i, (day, customer_id, book_id, rating, comment) in enumerate(rows, start=1)]


TAUGHT_FILE = DEMO_SOURCE_DIR / "taught.json"


def demo_teaching() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The taught pairs and glossary terms the demo ships (none is an evaluation question):
    what ``agentflow.teaching`` seeds into a new store for ``bookshop``."""
    data = json.loads(TAUGHT_FILE.read_text(encoding="utf-8"))
    return ([(e["question"], e["sql"]) for e in data["examples"]],
            [(g["term"], g["meaning"]) for g in data["glossary"]])
