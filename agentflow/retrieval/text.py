"""Word-level text normalisation shared by every retrieval tool.

Values, questions and schema names must be cut into words the same way, or a question word
never meets the value or column it names: "Café" vs "cafe", "orderItems" vs "order items",
"books" vs "book". Everything here is deterministic and locale-independent.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=[0-9])"
                    r"|(?<=[0-9])(?=[A-Za-z])")

# Function words and the words every text-to-SQL question uses to ask rather than to name.
STOP_WORDS: frozenset[str] = frozenset("""
a about above after again against all also am an and any are as at be because been before
being below between both but by can could did do does doing done down during each either
else ever every few for from further get gets give given got had has have having he her here
hers herself him himself his how i if in into is it its itself just let like list lists many
me might more most much must my myself need no nor not now of off on once one only or other
our ours ourselves out over own per please provide same shall she should show shown so some
such tell than that the their theirs them themselves then there these they this those
through to too under until up upon us very via was we were what whatever when where whether
which while who whom whose why will with within without would you your yours yourself
find display return returns named called whose among amongst including include includes
""".split())


def fold(text: str) -> str:
    """Case- and accent-insensitive form: 'Café Müller' -> 'cafe muller'."""
    decomposed = unicodedata.normalize("NFKD", text)
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return stripped.casefold()


def words(text: str) -> list[str]:
    """Folded alphanumeric words; punctuation and underscores separate words."""
    return _WORD.findall(fold(text))


def norm_key(text: str) -> str:
    """The exact-match key of a value: folded words joined by single spaces."""
    return " ".join(words(text))


@lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    """A light English plural/inflection stemmer: enough to meet 'books'/'book', 'cities'/'city'.

    Deliberately weaker than Porter: names and codes must survive (``Paris`` and ``Pari``
    still meet, since both sides are stemmed the same way, but nothing is cut below 3 letters).
    """
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "shes", "ches", "xes", "zes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def stems(text: str) -> list[str]:
    return [stem(w) for w in words(text)]


def split_identifier(name: str) -> list[str]:
    """Words of a schema name: 'floor_area_m2' -> floor area m 2; 'OrderItems' -> order items."""
    return words(_CAMEL.sub(" ", name))
