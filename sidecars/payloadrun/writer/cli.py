"""``payloadrun writer``: run the writer sidecar beside vLLM.

A reverse proxy in front of vLLM. Requests whose sampling parameters carry payload_dir (a
``v<k>`` directory under the payload root) get their routed_experts and sampling_mask written to
``<payload_dir>/<uuid>.bin`` and replaced by ``choices[i].payload`` segments; everything else
passes through unchanged. Every flag has an environment variable, named in its help (the operator
sets them: :class:`payloadrun.settings.Env` lists them); a flag wins over its variable. The
defaults are the CRD's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping

from payloadrun import serving, settings
from payloadrun.helptext import HelpFormatter, plain
from payloadrun.writer.config import (  # noqa: F401  (WriterListen, split_listen: moved here)
    COMMAND,
    WriterConfig,
    WriterListen,
    deprecated_in_use,
    listen_from,
    split_listen,
)

log = logging.getLogger("payloadrun.writer")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        COMMAND,
        help="run the writer sidecar: a reverse proxy to vLLM that moves payloads by handle",
        description=plain(__doc__),  # the settings: payloadrun.writer.config
        formatter_class=HelpFormatter,
    )
    settings.add_arguments(p, WriterConfig, WriterListen)
    p.set_defaults(run=run)


def configs(
    args: argparse.Namespace | None, env: Mapping[str, str] | None = None
) -> tuple[WriterConfig, WriterListen]:
    """The writer's config and address from flags, then the environment, then the defaults."""
    return settings.from_args(WriterConfig, args, env), listen_from(args, env)


def run(args: argparse.Namespace) -> int:
    try:
        config, where = configs(args)
    except (settings.SettingsError, ValueError) as exc:
        print(f"payloadrun {COMMAND}: {exc}", file=sys.stderr)
        return 2
    serving.configure_logging(where.log_level, where.log_format)
    for note in deprecated_in_use(args):
        log.warning("%s", note)
    from payloadrun.writer.server import listeners, log_started

    return serving.run_sidecar(
        COMMAND, serving.serve(listeners(config, where), started=log_started(config))
    )
