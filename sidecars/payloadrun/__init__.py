"""payloadrun: MoE router-replay ids and sampling masks moved by handle through a shared volume.

The writer sidecar stores a request's per-token arrays in one file under the run's payload root
and answers with segments (handles: file, offset, rows) instead of the arrays. What follows is
what the code on either side of that needs, by role; ``examples/orchestrator_trainer.py`` is all
of it in one runnable step.

The orchestrator
    ``payload_dir(root, version)``
        the directory a request names (``<root>/v<k>``), under the extra argument
        ``PAYLOAD_DIR_ARG``, for a rollout dispatched at policy version ``k``
    ``choice_segments(choice)``
        the segments of one answered choice (its ``PAYLOAD_FIELD``), or None when it came back
        inline; ``segments_from_json`` / ``segments_to_json`` for the list alone
    ``sample_segments(segments, prompt_len, completion_len)``
        the segments a training sample reads: ``clip_all`` to its positions plus
        ``final_token_row``, the row for the final token that routing never covers
    ``files_of(segments)``
        the files a batch holds, for the retention sidecar
    ``TracePayload``, ``Node``
        a multi-turn rollout (a tree of message nodes, verifiers' v1 traces): each turn's
        segments attributed to the nodes it created (``attribute_turn``: node-local positions,
        re-forwarded prefix rows dropped, the row that supersedes an earlier answer's final-token
        placeholder), and a branch's segments rebased to branch positions (``branch_segments``);
        ``TracePayload.files`` is every file its turns wrote (errors: ``TraceError``); the
        entries, ``NodeSegment``, are an append-only delta stream
    ``RetentionClient``, ``AsyncRetentionClient``
        tell the retention sidecar what each batch holds, when the trainer has read it and what
        no batch will read (errors: ``RetentionError``, ``DiscardConflictError``,
        ``RetentionVolumeHungError`` (the sidecar's volume hung past its deadline: retry later),
        ``RetentionUnavailableError``)
    ``decode_routed_experts``, ``decode_sampling_mask``
        the inline arrays of an answer the writer could not store (``CodecError``)

The trainer
    ``PayloadReader``
        reads a field of a batch's segments over a token range (``read_field`` for one call);
        errors: ``ShortReadError`` (the file stayed short after retries),
        ``ReadDeadlineError`` (the volume did not answer within the reader's deadline),
        ``SegmentOverlapError``, ``PayloadPathError`` (a file outside the payload root)

The formats, for both
    ``Env``
        the names of the variables the operator sets in the pods (``Env.PAYLOAD_ROOT``,
        ``Env.INFERENCE_URL``, ``Env.RETENTION_URL``, ...)
    ``Segment`` (``SegmentError``)
        ``rows`` rows of a field at byte ``offset`` of ``file``, the first at token ``pos``
    ``ROUTED_EXPERTS``, ``SAMPLING_MASK``
        the fields a segment holds
    ``ROUTING_FILL``, ``MASK_PAD``
        what a reader puts in cells no segment covers
    ``__version__``
        the installed version, the same in the sidecars, the operator and the chart

The writer's own parts (the codec's compaction and row building, the store) are imported from
their modules, ``payloadrun.codec`` and ``payloadrun.store``. This package imports neither torch
nor a Kubernetes client, and the names above are imported on first use, so that
``payloadrun.settings`` (which the operator imports) does not pull in numpy.
"""

# The TYPE_CHECKING imports are this package's exports, which ruff cannot see in a computed
# __all__; tests/dataplane/test_public_api.py checks them against __all__ instead.
# ruff: noqa: F401

from __future__ import annotations

import importlib
import importlib.util
import warnings
from typing import TYPE_CHECKING, Any

# The one listing: role, then the module each name lives in. __all__ and __getattr__ derive from
# it; the TYPE_CHECKING block below repeats it for type checkers, and
# tests/dataplane/test_public_api.py proves the two agree.
_PUBLIC: dict[str, dict[str, tuple[str, ...]]] = {
    "orchestrator": {
        "payloadrun.paths": ("payload_dir",),
        "payloadrun.segments": (
            "choice_segments",
            "clip_all",
            "files_of",
            "final_token_row",
            "sample_segments",
            "segments_from_json",
            "segments_to_json",
        ),
        "payloadrun.traces": (
            "Node",
            "NodeSegment",
            "TraceError",
            "TracePayload",
            "attribute_turn",
            "branch_segments",
        ),
        "payloadrun.retention.client": (
            "AsyncRetentionClient",
            "DiscardConflictError",
            "RetentionClient",
            "RetentionError",
            "RetentionUnavailableError",
            "RetentionVolumeHungError",
        ),
        "payloadrun.codec": ("CodecError", "decode_routed_experts", "decode_sampling_mask"),
    },
    "trainer": {
        "payloadrun.reader": (
            "PayloadReader",
            "ReadDeadlineError",
            "SegmentOverlapError",
            "ShortReadError",
            "read_field",
        ),
        "payloadrun.paths": ("PayloadPathError",),
    },
    "formats": {
        "payloadrun.settings": ("Env",),
        "payloadrun.segments": (
            "MASK_PAD",
            "PAYLOAD_DIR_ARG",
            "PAYLOAD_FIELD",
            "ROUTED_EXPERTS",
            "ROUTING_FILL",
            "SAMPLING_MASK",
            "Segment",
            "SegmentError",
        ),
        "payloadrun.version": ("__version__",),
    },
}

# Names the package root exported before it was organised by role: the writer's and the paths'
# internals. They still resolve, with a DeprecationWarning, until the next release.
_DEPRECATED: dict[str, str] = {
    **dict.fromkeys(
        (
            "PositionedRows",
            "compact_routed_experts",
            "mask_rows",
            "mask_rows_from_csr",
            "routing_pos",
            "routing_rows",
        ),
        "payloadrun.codec",
    ),
    **dict.fromkeys(("PayloadFile", "PayloadRoot"), "payloadrun.paths"),
    **dict.fromkeys(("PayloadStore", "PayloadWriteError"), "payloadrun.store"),
}

_HOME_OF = {
    name: module
    for modules in _PUBLIC.values()
    for module, names in modules.items()
    for name in names
}

__all__ = list(_HOME_OF)


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    module = _DEPRECATED.get(name)
    if module is not None:
        warnings.warn(
            f"payloadrun.{name} is deprecated and leaves the package root in the next release: "
            f"import it from {module}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)
    # A submodule, on first use (``import payloadrun; payloadrun.settings``). Dunder names are
    # what tools probe for (``__wrapped__``, ``__path__`` hooks), never a module here.
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'payloadrun' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from payloadrun.codec import (
        CodecError,
        decode_routed_experts,
        decode_sampling_mask,
    )
    from payloadrun.paths import PayloadPathError, payload_dir
    from payloadrun.reader import (
        PayloadReader,
        ReadDeadlineError,
        SegmentOverlapError,
        ShortReadError,
        read_field,
    )
    from payloadrun.retention.client import (
        AsyncRetentionClient,
        DiscardConflictError,
        RetentionClient,
        RetentionError,
        RetentionUnavailableError,
        RetentionVolumeHungError,
    )
    from payloadrun.segments import (
        MASK_PAD,
        PAYLOAD_DIR_ARG,
        PAYLOAD_FIELD,
        ROUTED_EXPERTS,
        ROUTING_FILL,
        SAMPLING_MASK,
        Segment,
        SegmentError,
        choice_segments,
        clip_all,
        files_of,
        final_token_row,
        sample_segments,
        segments_from_json,
        segments_to_json,
    )
    from payloadrun.settings import Env
    from payloadrun.traces import (
        Node,
        NodeSegment,
        TraceError,
        TracePayload,
        attribute_turn,
        branch_segments,
    )
    from payloadrun.version import __version__
