"""Every prompt the pipelines send, in one place.

Prompts are completion-style (the embedded default is a base model) and ordered for KV-cache
reuse: the part shared by all calls of a query — schema text, then retrieved examples — comes
first; the stage's own instruction comes last. SQL comments (``--``) frame everything, which
keeps small models in "writing SQL" mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Shot:
    question: str
    sql: str


def context(schema_text: str, dialect: str, shots: Sequence[Shot] = (),
            history: Sequence[Shot] = ()) -> str:
    """The shared prefix of a query's SQL-writing calls. ``history`` holds the earlier turns
    of a conversation (question and the SQL that answered it): a follow-up such as "now only
    for 2023" is read against them, so they come last, right before the question."""
    parts = [f"-- {dialect_name(dialect)} database schema:", schema_text.strip(), ""]
    if shots:
        parts.append("-- Example questions and their SQL:")
        for shot in shots:
            parts += [f"-- Question: {shot.question}", shot.sql.strip().rstrip(";") + ";", ""]
    if history:
        parts.append("-- Earlier in this conversation (the next question follows up on it):")
        for turn in history:
            parts += [f"-- Question: {turn.question}", turn.sql.strip().rstrip(";") + ";", ""]
    return "\n".join(parts) + "\n"


def with_history(question: str, history: Sequence[Shot] = ()) -> str:
    """The text to retrieve schema, values and examples for: a follow-up alone ("only for
    2023") names too little, so the earlier questions are added."""
    return " ".join([t.question for t in history] + [question])


def question_block(question: str, evidence: str = "") -> str:
    text = f"-- Question: {question.strip()}\n"
    if evidence.strip():
        text += f"-- Hint: {evidence.strip()}\n"
    return text


def generate_sql(ctx: str, question: str, evidence: str = "", *, values: Sequence[str] = (),
                 style: str = "plain") -> str:
    """Candidate generation. ``style`` varies the instruction so candidates differ."""
    lines = [ctx + question_block(question, evidence)]
    if values:
        lines.append("-- Values in the database that the question mentions: "
                     + "; ".join(values) + "\n")
    if style == "joins":
        lines.append("-- Join the tables on their keys when the answer needs several tables.\n")
    elif style == "stepwise":
        lines.append("-- Select only the columns the question asks for.\n")
    lines.append("-- SQL:\n")
    return "".join(lines)


def revise_sql(ctx: str, question: str, evidence: str, sql: str, feedback: str) -> str:
    """Execution-guided revision: the failed SQL and what the database said."""
    return (ctx + question_block(question, evidence)
            + f"-- This SQL is wrong:\n{sql};\n-- Database says: {feedback}\n"
            + "-- Corrected SQL:\n")


def extract_keywords(question: str, evidence: str = "") -> str:
    """CHESS's keyword/entity extraction, as a few-shot completion."""
    shots = [
        ("Which pilots flew more than 3 missions from Oslo in 2019?",
         "pilots, missions, more than 3, Oslo, 2019"),
        ("List the titles of albums recorded by Nina Simone.",
         "titles, albums, Nina Simone"),
        ("What is the average price of products in the 'Garden' category?",
         "average price, products, Garden, category"),
    ]
    text = "Extract the keywords and named values from each question.\n\n"
    for q, k in shots:
        text += f"Question: {q}\nKeywords: {k}\n\n"
    hint = f" (hint: {evidence.strip()})" if evidence.strip() else ""
    return text + f"Question: {question.strip()}{hint}\nKeywords:"


def generate_unit_tests(ctx: str, question: str, evidence: str, n_tests: int) -> str:
    return (ctx + question_block(question, evidence)
            + f"-- Several SQL answers disagree. Write {n_tests} short checks, one per line, "
            "that the result of a correct answer must pass (number of rows, columns, "
            "values).\n-- Check 1:")


def evaluate_candidate(ctx: str, question: str, evidence: str, checks: Sequence[str], sql: str,
                       result_preview: str) -> str:
    listed = "\n".join(f"-- Check {i + 1}: {c}" for i, c in enumerate(checks))
    body = "\n".join(f"-- {line}" for line in result_preview.splitlines())
    return (ctx + question_block(question, evidence) + listed + "\n"
            + f"-- Candidate SQL: {sql};\n-- Its result:\n{body}\n"
            + "-- Does the result pass all checks? Answer yes or no.\n-- Answer:")


def select_tables(schema_text: str, question: str, evidence: str = "") -> str:
    """MAC-SQL's selector: name the tables the question needs."""
    return (f"-- Database schema:\n{schema_text.strip()}\n\n" + question_block(question, evidence)
            + "-- Tables needed to answer the question (comma-separated):\n-- Tables:")


def decompose(ctx: str, question: str, evidence: str = "") -> str:
    """MAC-SQL's decomposer: sub-questions first, then the final SQL."""
    return (ctx + question_block(question, evidence)
            + "-- Break the question into simpler sub-questions, then write the final SQL.\n"
            + "-- Sub-question 1:")


def dialect_name(dialect: str) -> str:
    return {"sqlite": "SQLite", "duckdb": "DuckDB", "postgres": "PostgreSQL"}.get(
        dialect, dialect)
