"""Keywords of a question without an LLM: the fallback (and companion) of LLM extraction.

A 270M model often returns no keywords, malformed ones, or the whole question; value lookup
and schema linking still need something to search with. The heuristic favours what a
database stores verbatim (quoted strings, proper names, numbers and dates), then adds the
remaining content words, which name tables and columns.
"""

from __future__ import annotations

import re

from agentflow.retrieval.text import STOP_WORDS

_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”|‘([^’]+)’|`([^`]+)`"
                     r"|(?<![\w'])'([^']+?)'(?![\w])")
_MONTHS = ("january february march april may june july august september october november "
           "december jan feb mar apr jun jul aug sep sept oct nov dec").split()
_MONTH_RE = "|".join(sorted(_MONTHS, key=len, reverse=True))
_DATE = re.compile(
    r"\b\d{4}-\d{1,2}-\d{1,2}(?:[ T]\d{1,2}:\d{2}(?::\d{2})?)?\b"       # 2023-01-05
    r"|\b\d{1,2}/\d{1,2}/\d{2,4}\b"                                       # 5/1/2023
    rf"|\b(?:{_MONTH_RE})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}\b"   # March 5, 2023
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:{_MONTH_RE})\.?,?\s+\d{{4}}\b"   # 5 March 2023
    rf"|\b(?:{_MONTH_RE})\.?\s+\d{{4}}\b",                                # March 2023
    re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:[.,]\d+)*(?:\.\d+)?%?(?![\w])")
_TOKEN = re.compile(r"[^\W_](?:[\w'’.&-]*[^\W_])?", re.UNICODE)
# Lower-case words allowed inside a proper name: "Bank of America", "Leonardo da Vinci".
_NAME_JOINERS = frozenset({"of", "the", "de", "da", "di", "del", "della", "van", "von", "der",
                           "du", "la", "le", "y", "&"})
# Capitalised words that start questions or sentences without naming anything.
_LEADING = STOP_WORDS | frozenset({"name", "count", "compute", "calculate", "state", "identify",
                                   "describe", "indicate", "mention", "determine", "sort",
                                   "order", "rank", "among", "please", "for", "in", "on", "of",
                                   "what's", "who's", "how's", "whats"})
# Upper-case words in BIRD evidence that are SQL, not names ('... IS NULL', 'DIVIDE(...)').
_SQL_WORDS = frozenset("""SELECT FROM WHERE AND OR NOT IS NULL LIKE IN BETWEEN AS ON JOIN GROUP BY
ORDER HAVING LIMIT COUNT SUM AVG MIN MAX DIVIDE CAST REAL INTEGER TEXT CASE WHEN THEN ELSE END
DISTINCT TRUE FALSE SUBTRACT MULTIPLY ADD IIF STRFTIME SUBSTR DESC ASC""".split())
# Content words too generic to search values or columns with.
_GENERIC = frozenset({"number", "total", "amount", "average", "avg", "sum", "count", "maximum",
                      "minimum", "max", "min", "highest", "lowest", "largest", "smallest",
                      "greatest", "least", "top", "first", "last", "percent", "percentage",
                      "ratio", "times", "time", "difference", "different", "distinct",
                      "descending", "ascending", "order", "ordered", "sorted", "sort", "along",
                      "respectively", "corresponding", "information", "details", "info",
                      "records", "record", "result", "results", "value", "values", "greater",
                      "less", "fewer", "equal", "exactly", "whose", "e.g", "etc"})


def heuristic_keywords(question: str, evidence: str = "") -> list[str]:
    """Deterministic keywords: quoted strings, proper names, dates, numbers, content words.

    Order is by kind (most value-like first), then by position; duplicates (case-insensitive)
    are dropped. Evidence (BIRD's hint) contributes its quoted strings, names and numbers too.
    """
    out: list[str] = []
    seen: set[str] = set()

    def add(text: str) -> None:
        text = text.strip(" \t\n.,;:!?()[]{}")
        key = text.casefold()
        if text and key not in seen:
            seen.add(key)
            out.append(text)

    texts = [question or "", evidence or ""]
    quoted = [_quoted(t) for t in texts]
    for i, q in enumerate(quoted):
        for text, _, _, mark in q:
            if not (i == 1 and mark == "`"):  # evidence backticks quote column names
                add(text.strip("%"))
    # Blanking found spans (keeping offsets) stops their words being counted twice.
    masked = [_blank(t, [(s, e) for _, s, e, _ in q]) for t, q in zip(texts, quoted)]
    dates: list[list[str]] = []
    for i, text in enumerate(masked):
        found = list(_DATE.finditer(text))
        dates.append([m.group(0) for m in found])
        masked[i] = _blank(text, [(m.start(), m.end()) for m in found])
    covered: set[str] = set()
    for i, text in enumerate(masked):
        for name in _proper_names(text):
            if i == 1 and all(w.upper() in _SQL_WORDS for w in name.split()):
                continue  # evidence's SQL ('IS NULL'), not a name
            add(name)
            covered.update(w.casefold() for w in name.split())
    for i, text in enumerate(masked):
        for item in dates[i] + [m.group(0) for m in _NUMBER.finditer(text)]:
            add(item)
    for m in _TOKEN.finditer(masked[0]):  # content words from the question only
        word = re.sub(r"['’]s$", "", m.group(0)).strip("'’.")
        low = word.casefold()
        if (len(word) > 1 and low not in STOP_WORDS and low not in _GENERIC
                and low not in covered and not _NUMBER.fullmatch(word) and low not in _MONTHS):
            add(word)
    return out


def _quoted(text: str) -> list[tuple[str, int, int, str]]:
    """Quoted spans: (inner text, start, end, opening quote mark)."""
    found = []
    for m in _QUOTED.finditer(text):
        inner = next(g for g in m.groups() if g is not None)
        if inner.strip():
            found.append((inner.strip(), m.start(), m.end(), m.group(0)[0]))
    return found


def _blank(text: str, spans: list[tuple[int, int]]) -> str:
    """Replace spans by a sentence break of equal length, keeping other offsets valid."""
    chars = list(text)
    for start, end in spans:
        chars[start:end] = "." + " " * (end - start - 1)
    return "".join(chars)


def _proper_names(text: str) -> list[str]:
    """Runs of capitalised words ('Chiado Books', 'Bank of America'), skipping a sentence's
    leading question word ('Which', 'List') unless it starts a longer name."""
    names: list[str] = []
    run: list[str] = []
    sentence_start = True

    run_at_start = False

    def flush() -> None:
        while run and run[-1].casefold() in _NAME_JOINERS:
            run.pop()
        # A lone capitalised word opening a sentence is usually just the sentence's first word.
        if run and not (run_at_start and len(run) == 1):
            names.append(" ".join(run))
        run.clear()

    for m in re.finditer(r"[^\s]+", text):
        raw = m.group(0)
        word = re.sub(r"['’]s$", "", raw.strip("\"'“”‘’()[]{},;:!?."))
        ends_sentence = raw.rstrip("\"'”’)]").endswith((".", "?", "!", ";", ":")) and \
            not re.fullmatch(r"(?:[A-Z]\.)+|St\.|Mr\.|Mrs\.|Dr\.|Jr\.", word + ".")
        capital = bool(word) and word[0].isupper() and not word.isdigit()
        leading_word = sentence_start and word.casefold() in _LEADING
        if capital and not leading_word:
            if not run:
                run_at_start = sentence_start
            run.append(word)
        elif run and word.casefold() in _NAME_JOINERS and not ends_sentence:
            run.append(word)
        else:
            flush()
        if raw.startswith(("(", "\"", "“")) or raw.endswith((",", ")", "\"", "”")):
            flush()
        if ends_sentence:
            flush()
        sentence_start = ends_sentence or not word
    flush()
    return [n for n in names if n.casefold() not in _LEADING and not n.isdigit()]
