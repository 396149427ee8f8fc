"""GBNF grammars for constrained decoding with llama.cpp.

Why: a tiny base model (the embedded 270M Gemma) often drifts from SQL into prose, repeats the
question or never stops. Constraining decoding to the *shape* of one SQLite-style SELECT makes
every output a single statement that sqlglot can parse, so the pipeline spends its revision
rounds on wrong SQL rather than on non-SQL.

The grammar is deliberately a shape, not full SQL: keywords must be UPPERCASE (the grammar can
then tell keywords from identifiers without look-ahead: an unquoted identifier is never all
uppercase letters; it has a lowercase letter, a digit or an underscore, e.g. ``name``, ``T1``,
``CDSCode``; an all-uppercase name must be quoted). A table alias without ``AS`` is one letter
and at most two digits (``b``, ``T1``): otherwise a lowercase keyword (``FROM t where``) would
be read as an alias. Statements end at ``;`` or a blank line.
"""

from __future__ import annotations

# Rules shared by the whole-statement and after-"SELECT" grammars. Whitespace is one space or
# one newline plus indentation, so a blank line can only mean "end of statement".
_SQL_RULES = r"""
end         ::= ";" | "\n\n"
ws          ::= " " | "\n" " "{0,8}
ows         ::= ws?
select-stmt ::= select-core (ws compound-op ws select-core)* order-by? limit?
compound-op ::= "UNION ALL" | "UNION" | "INTERSECT" | "EXCEPT"
select-core ::= "SELECT" select-rest
select-rest ::= (ws "DISTINCT")? ws result-cols from? where? group-by?
from        ::= ws "FROM" ws from-clause
where       ::= ws "WHERE" ws expr
group-by    ::= ws "GROUP BY" ws expr-list (ws "HAVING" ws expr)?
order-by    ::= ws "ORDER BY" ws order-item (ows "," ows order-item)*
order-item  ::= expr (ws ("ASC" | "DESC"))?
limit       ::= ws "LIMIT" ws integer (ws "OFFSET" ws integer)?
result-cols ::= result-col (ows "," ows result-col)*
result-col  ::= "*" | expr (ws "AS" ws name)?
from-clause ::= table-ref (join)*
table-ref   ::= (qualified | "(" ows select-stmt ows ")") (ws "AS" ws name | ws short-alias)?
short-alias ::= [a-zA-Z] [0-9]{0,2}
join        ::= ows "," ows table-ref | ws join-op ws table-ref (ws "ON" ws expr)?
join-op     ::= "JOIN" | "INNER JOIN" | "LEFT JOIN" | "LEFT OUTER JOIN" | "CROSS JOIN"
expr-list   ::= expr (ows "," ows expr)*
expr        ::= and-expr (ws "OR" ws and-expr)*
and-expr    ::= not-expr (ws "AND" ws not-expr)*
not-expr    ::= ("NOT" ws)? cmp-expr
cmp-expr    ::= add-expr cmp-tail?
cmp-tail    ::= (ows cmp-op ows add-expr
              | ws "IS" (ws "NOT")? ws "NULL"
              | ws ("NOT" ws)? "LIKE" ws add-expr
              | ws ("NOT" ws)? "IN" ows "(" ows (select-stmt | expr-list) ows ")"
              | ws ("NOT" ws)? "BETWEEN" ws add-expr ws "AND" ws add-expr)
cmp-op      ::= "=" | "!=" | "<>" | "<=" | ">=" | "<" | ">"
add-expr    ::= mul-expr (ows add-op ows mul-expr)*
add-op      ::= "+" | "-" | "||"
mul-expr    ::= unary (ows mul-op ows unary)*
mul-op      ::= "*" | "/" | "%"
unary       ::= "-"? primary
primary     ::= (literal | func-call | column | case-expr | cast-expr
              | "(" ows (select-stmt | expr) ows ")")
func-call   ::= func-name "(" ows ("*" | ("DISTINCT" ws)? expr-list)? ows ")"
func-name   ::= ("COUNT" | "SUM" | "AVG" | "MIN" | "MAX" | "ABS" | "ROUND" | "LENGTH" | "LOWER"
              | "UPPER" | "SUBSTR" | "INSTR" | "REPLACE" | "TRIM" | "COALESCE" | "IFNULL"
              | "NULLIF" | "IIF" | "STRFTIME" | "DATE" | "JULIANDAY" | name)
case-expr   ::= "CASE" (ws expr)? when-then+ (ws "ELSE" ws expr)? ws "END"
when-then   ::= ws "WHEN" ws expr ws "THEN" ws expr
cast-expr   ::= "CAST" ows "(" ows expr ws "AS" ws type-name ows ")"
type-name   ::= "INTEGER" | "REAL" | "TEXT" | "NUMERIC" | "FLOAT"
column      ::= qualified ("." "*")?
qualified   ::= name ("." name)?
name        ::= bare-name | "\"" [^"\n]{1,64} "\"" | "`" [^`\n]{1,64} "`" | "[" [^\]\n]{1,64} "]"
bare-name   ::= [a-z_] [a-zA-Z0-9_]{0,63} | [A-Z] [A-Z]{0,31} [a-z0-9_] [a-zA-Z0-9_]{0,63}
literal     ::= number | string | "NULL"
number      ::= integer ("." [0-9]{1,12})?
integer     ::= [0-9]{1,12}
string      ::= "'" ([^'\n] | "''"){0,128} "'"
"""

#: One whole statement: ``SELECT ...;`` (or ``... UNION SELECT ...``), nothing before or after.
SQL_SELECT_GBNF = "root ::= select-stmt ows end\n" + _SQL_RULES

#: The continuation of a statement whose ``SELECT`` keyword is already in the prompt (the
#: pipelines' ``answer_prefix="SELECT"``): the rest of that SELECT, then the statement's tail.
SQL_AFTER_SELECT_GBNF = (
    "root ::= select-rest (ws compound-op ws select-core)* order-by? limit? ows end\n"
    + _SQL_RULES
)


def sql_select_grammar(answer_prefix: str = "") -> str:
    """The SELECT grammar for text generated after ``answer_prefix``.

    Only the two prefixes pipelines use are supported (none, or ``SELECT``): a grammar must
    start exactly where the prompt ends, and other prefixes would need their own start rule.
    """
    prefix = answer_prefix.strip()
    if prefix == "":
        return SQL_SELECT_GBNF
    if prefix.upper() == "SELECT" and prefix == "SELECT":
        return SQL_AFTER_SELECT_GBNF
    raise ValueError(
        f"no SQL grammar for answer_prefix {answer_prefix!r}: use '' or 'SELECT' "
        "(keywords in the grammar are uppercase)")


def schema_sql_grammar(tables: dict[str, list[str]], answer_prefix: str = "SELECT") -> str:
    """The SELECT grammar with table and column names restricted to ``tables``.

    Why: a tiny model's most common error is a table or column that does not exist
    ("Singers" for ``singer``). Restricting identifiers to the schema shown in the prompt
    removes that whole class of failures; aliases (``T1``) and ``AS`` names stay free.
    Names that are not plain identifiers (spaces, all-uppercase) must be double-quoted.
    """
    if not tables:
        raise ValueError("schema_sql_grammar needs at least one table")
    base = sql_select_grammar(answer_prefix)
    table_alts = sorted({alt for t in tables for alt in _name_forms(t)})
    column_alts = sorted({alt for cols in tables.values() for c in cols for alt in _name_forms(c)})
    rules = [
        'table-name  ::= ' + " | ".join(table_alts),
        'column-name ::= ' + " | ".join(column_alts),
        "qualifier   ::= table-name | short-alias",
        'column      ::= (qualifier ".")? (column-name | "*")',
        "qualified   ::= table-name",
    ]
    kept = [line for line in base.splitlines()
            if not line.startswith(("column      ::=", "qualified   ::="))]
    # Only known SQL functions: a free name here lets the model call a column as a function.
    kept = [line.replace('| "NULLIF" | "IIF" | "STRFTIME" | "DATE" | "JULIANDAY" | name)',
                         '| "NULLIF" | "IIF" | "STRFTIME" | "DATE" | "JULIANDAY")')
            for line in kept]
    return "\n".join(kept + rules) + "\n"


def without_star(grammar: str) -> str:
    """``grammar`` with ``*`` removed from the result columns (``SELECT *``, ``t.*``), for the
    retry of a candidate that answered a specific question with whole rows; ``COUNT(*)`` and
    multiplication stay. Works on ``SQL_*_GBNF`` and ``schema_sql_grammar`` output."""
    lines = []
    for line in grammar.splitlines():
        if line.startswith("result-col  ::="):
            line = line.replace('"*" | ', "", 1)
        elif line.startswith("column      ::="):
            line = line.replace('(column-name | "*")', "column-name").replace(' ("." "*")?', "")
        lines.append(line)
    out = "\n".join(lines) + ("\n" if grammar.endswith("\n") else "")
    if out == grammar:
        raise ValueError("not an agentflow SQL grammar: no result-col rule to change")
    return out


def _name_forms(name: str) -> list[str]:
    """GBNF literals for a name: quoted always, bare when the bare form parses as a name."""
    escaped = name.replace("\\", "\\\\").replace('"', '\\"\\"')  # SQL doubles a quote
    quoted = '"\\"' + escaped + '\\""'
    forms = [quoted]
    import re

    if re.fullmatch(r"[a-z_][a-zA-Z0-9_]*|[A-Z][A-Z]*[a-z0-9_][a-zA-Z0-9_]*", name):
        forms.append('"' + name + '"')
    return forms
