"""A pydantic validation error in the words of a refusal: each problem once, at its field's path.

pydantic words a validator's error as ``Value error, <message>`` at the location of the model
that raised it (``spec.inference: Value error, spec.inference.workerTemplate is ...``): the
prefix is pydantic's, not the user's business, and a message that names its own field needs no
second path before it. :func:`messages` drops the prefix, writes list indices as Kubernetes
does (``spec.clients[0].ipBlock``), and keeps the path only where the message does not start
with a field path itself.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

# what pydantic puts before the message of a ValueError or an assert in a validator
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")
# a message that starts with a field's path names its field itself
_NAMES_ITS_FIELD = re.compile(r"^[a-z][A-Za-z0-9]*(\.[A-Za-z0-9_]+|\[\d+\])+ ")


def field_path(prefix: str, loc: tuple[Any, ...]) -> str:
    """``spec`` and ``("clients", 0, "ipBlock")`` -> ``spec.clients[0].ipBlock``."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else str(part)
    return path


def message(error: dict[str, Any], prefix: str = "spec", where: str = "") -> str:
    """One of ``ValidationError.errors()`` as a refusal's sentence."""
    text = str(error["msg"])
    for noise in _PYDANTIC_PREFIXES:
        if text.startswith(noise):
            text = text[len(noise) :]
    if _NAMES_ITS_FIELD.match(text):
        return text
    path = field_path(prefix, tuple(error.get("loc", ()))) or where
    return f"{path}: {text}" if path else text


def messages(exc: ValidationError, prefix: str = "spec", where: str = "") -> list[str]:
    """Every problem of ``exc``, once each (``where`` names the whole when the path is empty)."""
    return list(dict.fromkeys(message(e, prefix, where) for e in exc.errors()))
