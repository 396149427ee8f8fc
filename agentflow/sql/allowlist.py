"""Which functions a query may call, per dialect: an allow-list, not a deny-list.

A deny-list fails open: the next dangerous function (``pg_terminate_backend`` written
``"pg_terminate_backend"``, ``query_to_xml``, ``lo_import``, a new DuckDB table function) passes
until someone adds its name. So the guard allows only the scalar, aggregate, window and
table functions that questions about a database need — strings, numbers, dates, aggregates,
windows, conditionals, casts, JSON and lists — and refuses every other function, naming it.
The lists were drawn from what Spider/BIRD gold SQL and ordinary analytics use (the Spider
gold queries are a test: none may be refused) and from each engine's documentation of its
pure functions; anything that reads files, runs SQL from text, changes settings or session
state, signals the server or takes locks is left out on purpose.

Names are compared after normalisation, so quoting (``"x"``, ```x```, ``[x]``), case,
comments between the name and its parenthesis (the tokenizer drops them) and a system-schema
prefix (``pg_catalog.x``, ``main.x``) cannot change the verdict. sqlglot turns most known
functions into typed nodes (``exp.Upper``...) rather than names; the typed nodes allowed are
exactly those the allowed names parse into in that dialect, plus the few node types that are
syntax rather than calls (``CASE``, ``CAST``, ``AND``, ``EXISTS``, ``CURRENT_DATE``...).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# ------------------------------------------------------------------------------- building blocks
_AGGREGATES = _names("""
    count sum avg min max
""")
_WINDOW = _names("""
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value
    nth_value
""")
_CONDITIONAL = _names("coalesce nullif")
_STRING = _names("length lower upper substr substring trim ltrim rtrim replace")
_MATH = _names("""
    abs round ceil ceiling floor trunc sqrt exp ln log log10 power pow sign mod pi random
    degrees radians sin cos tan asin acos atan atan2 cot
""")
_COMMON = _AGGREGATES | _WINDOW | _CONDITIONAL | _STRING | _MATH

SQLITE = _COMMON | _names("""
    total group_concat string_agg
    ifnull iif likely unlikely likelihood
    char hex unhex instr quote unicode octet_length concat concat_ws printf format
    glob like regexp
    typeof
    date time datetime julianday strftime unixepoch timediff
    acosh asinh atanh cosh sinh tanh log2
    json json_array json_array_length json_extract json_insert json_object json_patch
    json_quote json_remove json_replace json_set json_type json_valid json_group_array
    json_group_object jsonb json_each json_tree
""")

DUCKDB = _COMMON | _names("""
    mean median mode quantile quantile_cont quantile_disc percentile_cont percentile_disc
    stddev stddev_pop stddev_samp variance var_pop var_samp corr covar_pop covar_samp
    regr_avgx regr_avgy regr_count regr_intercept regr_r2 regr_slope regr_sxx regr_sxy regr_syy
    approx_count_distinct approx_quantile arg_max arg_min argmax argmin max_by min_by
    any_value first last list array_agg string_agg listagg group_concat bool_and bool_or
    bit_and bit_or bit_xor count_if countif fsum sumkahan kahan_sum kurtosis kurtosis_pop
    skewness entropy product favg histogram
    ifnull if iif greatest least
    concat concat_ws contains ends_with starts_with prefix suffix left right lpad rpad
    repeat reverse split_part string_split str_split string_split_regex string_to_array
    regexp_matches regexp_replace regexp_extract regexp_extract_all regexp_full_match
    regexp_split_to_array instr position strpos ascii chr ord lcase ucase len strlen
    char_length character_length octet_length bit_length translate levenshtein
    damerau_levenshtein jaccard jaro_similarity jaro_winkler_similarity hamming mismatches
    printf format md5 hash like_escape ilike_escape array_to_string list_aggr list_aggregate
    strip_accents nfc_normalize
    cbrt log2 isnan isinf isfinite gcd lcm factorial even round_even bit_count
    greatest_common_divisor least_common_multiple
    current_date current_timestamp now today date_trunc datetrunc date_part datepart
    date_diff datediff date_sub datesub date_add strftime strptime try_strptime epoch
    epoch_ms make_date make_time make_timestamp year month day dayofmonth dayofweek dayofyear
    week weekday weekofyear yearweek quarter hour minute second millisecond microsecond
    last_day monthname dayname age to_timestamp to_days to_months to_years to_hours
    to_minutes to_seconds time_bucket extract isodow isoyear era decade century millennium
    julian
    list_value list_extract list_element array_extract list_contains list_has array_contains
    list_position array_position list_sort array_sort list_reverse_sort list_distinct
    array_distinct list_unique list_slice array_slice list_filter array_filter
    list_transform array_transform list_reduce list_concat array_concat list_cat list_sum
    list_min list_max list_avg list_count array_length cardinality unnest flatten
    list_has_any list_has_all struct_pack struct_extract row
    json_extract json_extract_string json_extract_path json_extract_path_text json_value
    json_type json_valid json_array_length json_keys json_object json_array to_json
    json_group_array json_group_object json_contains
    try_cast typeof
    range generate_series
""")

POSTGRES = _COMMON | _names("""
    stddev stddev_pop stddev_samp variance var_pop var_samp corr covar_pop covar_samp
    regr_avgx regr_avgy regr_count regr_intercept regr_r2 regr_slope regr_sxx regr_sxy regr_syy
    array_agg string_agg bool_and bool_or every bit_and bit_or bit_xor percentile_cont
    percentile_disc mode json_agg jsonb_agg json_object_agg jsonb_object_agg any_value
    greatest least
    char_length character_length octet_length bit_length initcap btrim translate concat
    concat_ws left right lpad rpad repeat reverse position strpos split_part starts_with
    string_to_array array_to_string regexp_replace regexp_match regexp_matches
    regexp_split_to_array regexp_like regexp_count regexp_substr regexp_instr ascii chr md5
    format to_char to_number to_date to_timestamp
    cbrt div width_bucket gcd lcm factorial scale
    now current_date current_timestamp current_time localtime localtimestamp date_trunc
    date_part extract age make_date make_time make_timestamp make_timestamptz make_interval
    justify_days justify_hours justify_interval date_bin isfinite
    json_extract_path json_extract_path_text jsonb_extract_path jsonb_extract_path_text
    json_array_length jsonb_array_length json_typeof jsonb_typeof to_json to_jsonb
    json_build_object jsonb_build_object json_build_array jsonb_build_array
    json_object_keys jsonb_object_keys json_array_elements jsonb_array_elements
    json_array_elements_text jsonb_array_elements_text json_each jsonb_each json_each_text
    jsonb_each_text
    array_length cardinality array_position array_positions array_remove array_append
    array_prepend array_cat array_upper array_lower unnest
    generate_series regexp_split_to_table string_to_table
""")

# Two functions no question needs but that stay allowed: they only spend time or bytes, which
# the engine limits and the watchdog bound (statement_timeout; SQLITE_LIMIT_LENGTH and the
# interrupt), and they are the probes the tests of those limits are written with.
SQLITE |= _names("randomblob")
POSTGRES |= _names("pg_sleep")

ALLOWED: dict[str, frozenset[str]] = {"sqlite": SQLITE, "duckdb": DUCKDB, "postgres": POSTGRES}
# A dialect without its own list (sqlglot's generic one, used when none is given) gets the
# union: every name in it is a pure function in the engine that lists it.
_ANY = SQLITE | DUCKDB | POSTGRES

# Schemas a function may be qualified with: the engine's own catalog, where the built-ins live.
_SYSTEM_SCHEMAS = {"sqlite": {"main", "temp"}, "duckdb": {"main", "system", "pg_catalog"},
                   "postgres": {"pg_catalog"}}

# Typed nodes that are syntax rather than a named call, and the two typed forms sqlglot picks
# from an argument's type (``date_trunc('month', d)`` on a DATE), allowed everywhere.
_SYNTAX: tuple[type[exp.Expr], ...] = tuple(
    getattr(exp, name) for name in (
        "And", "Or", "Xor", "Case", "If", "Cast", "TryCast", "Collate", "Exists", "Array",
        "Struct", "Extract", "CurrentDate", "CurrentTime", "CurrentTimestamp", "Localtime",
        "Localtimestamp", "JSONExtract", "JSONExtractScalar", "JSONBExtract",
        "JSONBExtractScalar", "ArrayContainsAll", "ArrayContainedBy", "ArrayOverlaps",
        "RegexpLike", "RegexpILike", "Pow", "DateTrunc", "CastToStrType", "Unnest", "Explode",
    ) if hasattr(exp, name))

# Why the most dangerous families are refused, for a clearer message (the allow-list refuses
# them anyway): table functions that run SQL given as text, and anything touching files.
_RUNS_SQL = _names("""
    query query_table query_to_xml query_to_xml_and_xmlschema query_to_xmlschema cursor_to_xml
    cursor_to_xmlschema table_to_xml table_to_xml_and_xmlschema database_to_xml schema_to_xml
    dblink dblink_exec json_execute_serialized_sql pg_catalog_query
""")
_FILE_WORDS = ("read_", "_scan", "readfile", "writefile", "pg_ls_", "pg_read", "pg_stat_file",
               "lo_", "glob", "load_", "copy", "file", "sniff_csv", "parquet", "csv")


@dataclass(frozen=True)
class Verdict:
    """A refused function: its normalised name and why, for the error message."""

    name: str
    reason: str


def normalised_name(node: exp.Func) -> str:
    """The function's name as the engine resolves it: unquoted, lower-case, no schema."""
    if isinstance(node, (exp.Anonymous, exp.AnonymousAggFunc)):
        return (node.name or str(node.this)).lower()
    return node.sql_name().lower()


def _qualifier(node: exp.Func) -> str | None:
    """The schema (or, in DuckDB, the receiver of a method call) written before the name."""
    parent = node.parent
    if isinstance(parent, exp.Dot) and parent.expression is node:
        left = parent.this
        if isinstance(left, (exp.Identifier, exp.Column)) and left.name:
            return left.name.lower()
        return left.sql()
    if isinstance(parent, exp.Table) and parent.this is node:
        parts = [parent.args.get("catalog"), parent.args.get("db")]
        named = [p.name.lower() for p in parts if p is not None and p.name]
        return ".".join(named) or None
    return None


def check_function(node: exp.Func, dialect: str | None) -> Verdict | None:
    """None when ``node`` may run in ``dialect``; else what to tell the caller."""
    if isinstance(node, _SYNTAX):
        return None
    qualifier = _qualifier(node)
    anonymous = isinstance(node, (exp.Anonymous, exp.AnonymousAggFunc))
    # A typed node's written name is generated SQL (the whole call, arguments included):
    # only a refusal's message needs it, so an allowed call never pays for it.
    name = normalised_name(node) if anonymous else None
    if qualifier is not None and qualifier not in _SYSTEM_SCHEMAS.get(dialect or "", ()):
        # ``'x'.repeat(5)`` in DuckDB is repeat('x', 5) in disguise; other schemas hold
        # functions nobody vetted.
        shown = name if name is not None else _written_name(node, dialect)
        return Verdict(f"{qualifier}.{shown}", "is a qualified function or a method call; "
                       "call the built-in function by its plain name")
    if name is not None:
        if name in ALLOWED.get(dialect or "", _ANY):
            return None
    elif type(node) in _allowed_types(dialect or ""):
        return None
    else:
        name = _written_name(node, dialect)
    return Verdict(name, _why(name))


def _why(name: str) -> str:
    if name in _RUNS_SQL or name.startswith("dblink"):
        return "runs SQL given as text, which the guard cannot check"
    if name.startswith(("load_", "install")):
        return "loads code into the engine"
    if any(word in name for word in _FILE_WORDS):
        return "reads or writes files"
    return ("is not on the allow-list of functions a query may call (strings, numbers, dates, "
            "aggregates, windows, conditionals, casts, JSON, lists)")


def _written_name(node: exp.Func, dialect: str | None) -> str:
    """How ``dialect`` spells a typed node, for messages (``TIME_TO_STR`` is ``strftime``)."""
    try:
        text = node.sql(dialect=dialect)
    except Exception:  # noqa: BLE001 - generation can fail on odd trees; fall back to the key
        return node.sql_name().lower()
    head = text.split("(", 1)[0].strip()
    return head.lower() if head and " " not in head else node.sql_name().lower()


@cache
def _allowed_types(dialect: str) -> frozenset[type[exp.Expr]]:
    """The typed nodes the allowed names of ``dialect`` parse into (``instr`` -> StrPosition).

    Derived rather than listed, so the names above are the single source of truth and a
    sqlglot upgrade that types one more function keeps it allowed. Names the parser builds
    from its FUNCTIONS table are built directly (cheap); the few with their own syntax
    (``CAST``, ``EXTRACT``, ``TRIM``...) are parsed; names the parser does not know stay
    Anonymous and need no type. About 0.1-0.3 s per dialect, once per process."""
    parser = Dialect.get_or_raise(dialect or None).parser_class
    found: set[type[exp.Expr]] = set()
    for name in ALLOWED.get(dialect, _ANY):
        key = name.upper()
        if key in parser.FUNCTION_PARSERS or key in parser.NO_PAREN_FUNCTIONS:
            found |= _parsed_types(name, dialect)
        elif key in parser.FUNCTIONS:
            found |= _built_types(parser.FUNCTIONS[key], dialect)
    return frozenset(found)


def warm(dialect: str | None) -> None:
    """Derive ``dialect``'s allowed types now, so the first query is not charged for it."""
    _allowed_types(dialect or "")


def _typed(tree: exp.Expr) -> set[type[exp.Expr]]:
    return {type(f) for f in tree.find_all(exp.Func)
            if not isinstance(f, (exp.Anonymous, exp.AnonymousAggFunc))}


def _parsed_types(name: str, dialect: str) -> set[type[exp.Expr]]:
    found: set[type[exp.Expr]] = set()
    for args in ("a", "a, b", "a, b, c", ""):
        try:
            found |= _typed(sqlglot.parse_one(f"SELECT {name}({args}) FROM t",
                                              read=dialect or None))
        except (ParseError, TokenError, ValueError, TypeError, KeyError):
            continue
    return found


def _built_types(builder: Callable[..., Any], dialect: str) -> set[type[exp.Expr]]:
    try:
        takes_dialect = "dialect" in inspect.signature(builder).parameters
    except (TypeError, ValueError):
        takes_dialect = False
    found: set[type[exp.Expr]] = set()
    for n in (1, 2, 3, 0):
        args = [exp.column(c) for c in "abc"[:n]]
        try:
            node = (builder(args, dialect=Dialect.get_or_raise(dialect or None))
                    if takes_dialect else builder(args))
        except Exception:  # noqa: BLE001 - a builder refusing this arity is expected
            continue
        if isinstance(node, exp.Expression):
            found |= _typed(node)
    return found
