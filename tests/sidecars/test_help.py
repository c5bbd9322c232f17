"""Every ``--help`` of both commands, and of each subcommand: plain text (no Sphinx or reST markup
from the docstrings it is made of), every flag and positional described, a default said once,
and the operator's settings listed from OperatorSettings itself (issue 34)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from payloadrun import cli
from payloadrun.helptext import HelpFormatter, fill, plain
from payloadrun.testing import fakevllm, roles
from payloadrun_operator import __main__ as operator_main
from payloadrun_operator.platform.settings import OperatorSettings

# (the module `python -m` runs, its parser)
COMMANDS = {
    "payloadrun": ("payloadrun.cli", cli.build_parser),
    "payloadrun-operator": ("payloadrun_operator", operator_main.build_parser),
    # not a console script, but shipped and run by hand (docs/writer.md)
    "python -m payloadrun.testing.fakevllm": ("payloadrun.testing.fakevllm", fakevllm.build_parser),
    # the end-to-end pods' orchestrator and trainer, in the sidecar image (docs/operator.md)
    "python -m payloadrun.testing.roles": ("payloadrun.testing.roles", roles.build_parser),
}
REPO = Path(__file__).resolve().parents[2]
MARKUP = re.compile(r":[a-z]+:`|``")


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


def every_parser() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    return [found for name, (_, build) in COMMANDS.items() for found in walk(build(), (name,))]


def ids(value: object) -> str:
    return " ".join(value[0]) if isinstance(value, tuple) else str(value)


PARSERS = every_parser()


def test_every_command_and_subcommand_is_walked():
    walked = {" ".join(path) for path, _ in PARSERS}
    assert walked == {
        "payloadrun",
        "payloadrun retention",
        "payloadrun simulate",
        "payloadrun wipe",
        "payloadrun writer",
        "payloadrun-operator",
        "payloadrun-operator render",
        "python -m payloadrun.testing.fakevllm",
        "python -m payloadrun.testing.roles",
        "python -m payloadrun.testing.roles idle",
        "python -m payloadrun.testing.roles orchestrator",
        "python -m payloadrun.testing.roles trainer",
        "python -m payloadrun.testing.roles update-weights",
    }


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=[ids(p) for p in PARSERS])
def test_every_flag_and_positional_is_described_once(path, parser):
    formatter = parser._get_formatter()
    for action in parser._actions:
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help is not argparse.SUPPRESS, f"{name} has no help"
        shown = formatter._expand_help(action)
        assert shown.count("(default") <= 1, f"{name}: {shown}"
        assert "(default: None)" not in shown, f"{name}: {shown}"
        assert not MARKUP.search(shown), f"{name}: {shown}"
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                assert choice.help, f"{' '.join(path)} {choice.dest} has no help"


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=[ids(p) for p in PARSERS])
def test_help_as_printed_is_plain_text(path, parser):
    """The real command's --help, as a user runs it."""
    module, _ = COMMANDS[path[0]]
    result = subprocess.run(
        [sys.executable, "-m", module, *path[1:], "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "100"},
    )
    text = result.stdout
    assert text.startswith("usage: ")
    assert not MARKUP.search(text), MARKUP.search(text)
    assert "(default: None)" not in text
    assert "(default: a temporary directory) (default" not in text


def test_the_operator_lists_every_setting_with_its_default():
    text = operator_main.build_parser().format_help()
    section = text[text.index("settings (environment variables") :].splitlines()[1:]
    entries: dict[str, str] = {}
    for line in section:
        if not line.startswith("      "):
            current = line.split()[0]
            entries[current] = ""
        entries[current] += " " + line.strip()
    expected = []
    for f in dataclasses.fields(OperatorSettings):
        s = f.metadata["setting"]
        expected.append(s.env)
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        entry = entries.get(s.env, "")
        assert " ".join(s.help.split()) in entry, s.env
        assert f"(default: {operator_main.shown_default(default)})" in entry, (s.env, entry)
    assert list(entries) == expected


def test_the_operator_page_lists_every_setting():
    """docs/operator.md's table names each variable, in full or as ``..._SUFFIX`` beside its
    sibling in the same row."""
    text = (REPO / "docs" / "operator.md").read_text()
    section = text[text.index("## Settings (environment)") :]
    section = section[: section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    missing = []
    for f in dataclasses.fields(OperatorSettings):
        env = f.metadata["setting"].env
        first_cells = [row.split("|")[1] for row in rows]
        if not any(
            f"`{env}`" in cell
            or any(env.endswith(short[3:]) for short in re.findall(r"`(\.\.\.\w+)`", cell))
            for cell in first_cells
        ):
            missing.append(env)
    assert missing == [], f"docs/operator.md, Settings (environment), lacks {missing}"


def test_plain_drops_sphinx_roles_and_literals():
    assert plain("see :class:`payloadrun.settings.Env` and ``--url``") == (
        "see payloadrun.settings.Env and --url"
    )
    assert plain(":func:`~admission.admit`") == "admission.admit"


def test_fill_keeps_lists_and_blocks():
    text = "A paragraph\nwrapped here.\n\n- one item\n  continued\n- two\n\n  an indented  block\n"
    assert fill(text, 80) == (
        "A paragraph wrapped here.\n\n- one item continued\n- two\n\n  an indented  block"
    )


def test_a_default_is_added_only_when_there_is_one_to_say():
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    parser.add_argument("--a", default=3, help="three")
    parser.add_argument("--b", help="none")
    parser.add_argument("--c", default=0, help="zero")
    parser.add_argument("--d", default=5, help="five (default: five)")
    parser.add_argument("--e", action="store_true", help="a switch")
    text = " ".join(parser.format_help().split())
    assert "three (default: 3)" in text and "zero (default: 0)" in text
    assert "none --c" in text and "five (default: five) --e" in text
    assert "a switch" in text and "(default: False)" not in text
