"""The ``payloadrun`` command. Each subcommand lives in its own module, which registers itself."""

from __future__ import annotations

import argparse
import importlib
import sys

from payloadrun.version import add_version_flag

# Modules with ``register(subparsers)``; each adds one subcommand whose handler is ``args.run``.
SUBCOMMANDS = (
    "payloadrun.retention.cli",
    "payloadrun.simulate",
    "payloadrun.wipe",
    "payloadrun.writer.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="payloadrun",
        description="MoE router-replay ids and sampling masks moved by handle through a shared "
        "volume: the data-plane tools.",
    )
    add_version_flag(parser)
    subparsers = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        required=True,
        help="one of these; payloadrun COMMAND --help describes its flags",
    )
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(subparsers)
    for subcommand in subparsers.choices.values():  # `payloadrun writer --version` too
        add_version_flag(subcommand)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
