"""What every ``--help`` of the project is made of: plain text, each flag described once.

Module docstrings carry Sphinx roles (``:class:`x```) and double backquotes for the API docs;
:func:`plain` turns them into what a terminal should show. :class:`HelpFormatter` fills a
description's paragraphs to the terminal but keeps its lists and indented blocks as written, and
adds a flag's default only when the help does not state one and there is one (argparse's own
formatter prints ``(default: None)``, even after a help that says the default in words).
``tests/sidecars/test_help.py`` walks every parser of both commands and holds them to this.
"""

from __future__ import annotations

import argparse
import re
import textwrap

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :class:`payloadrun.settings.Env` -> the target
_LITERAL = re.compile(r"``([^`]+)``")


def plain(text: str) -> str:
    """``text`` (a docstring) without Sphinx roles or reST literals, for a terminal."""
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text)).strip()


def fill(text: str, width: int, indent: str = "") -> str:
    """Paragraphs filled to ``width``; a ``- `` item is filled on its own with a hanging indent,
    and an indented line (a table, an example) is kept as it is."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text.strip("\n")):
        items: list[list[str]] = []
        for line in paragraph.splitlines():
            bullet = bool(items) and items[-1][0].startswith("- ")
            block = bool(items) and items[-1][0].startswith(" ")
            if line.startswith("- ") or not items or block or (line[:1] == " " and not bullet):
                items.append([line])
            else:
                items[-1].append(line)
        lines = []
        for item in items:
            first = item[0]
            if first.startswith(" "):
                lines.append(indent + first)
                continue
            hang = "  " if first.startswith("- ") else ""
            lines.append(
                textwrap.fill(
                    " ".join(part.strip() for part in item),
                    width,
                    initial_indent=indent,
                    subsequent_indent=indent + hang,
                )
            )
        out.append("\n".join(lines))
    return "\n\n".join(out)


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions filled by :func:`fill`; ``(default: X)`` after a flag's help unless the help
    already says its default or there is none to say."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return fill(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "default" in text
            or any(action.default is none for none in (None, False, argparse.SUPPRESS))
            or not action.option_strings
            or action.nargs == 0
        ):
            return text
        return f"{text} (default: %(default)s)"
