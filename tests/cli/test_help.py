"""Every CLI option explains itself, in plain text (no reStructuredText markup)."""

from __future__ import annotations

import argparse

from agentflow.cli.main import build_parser


def _parsers(parser: argparse.ArgumentParser, path: str = "agentflow"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_option_has_help_and_no_rst_backticks() -> None:
    missing, marked = [], []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction,
                                   argparse._VersionAction)):
                continue
            name = "/".join(action.option_strings) or action.dest
            if not action.help:
                missing.append(f"{path} {name}")
        text = parser.format_help()
        if "``" in text:
            marked.append(path)
    assert not missing, missing
    assert not marked, marked
