"""payloadrun: MoE router-replay ids and sampling masks moved by handle through a shared volume.

The data-plane library: segments (the handles), the codec (vLLM's inline forms to payload rows),
the store (writes one file per request) and the reader (reads a field over a token range).
It imports neither torch nor a Kubernetes client. The names below are imported on first use, so
that ``payloadrun.settings`` (which the operator imports) does not pull in numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "payloadrun.codec": (
        "CodecError",
        "PositionedRows",
        "compact_routed_experts",
        "decode_routed_experts",
        "decode_sampling_mask",
        "mask_rows",
        "mask_rows_from_csr",
        "routing_pos",
        "routing_rows",
    ),
    "payloadrun.paths": ("PayloadFile", "PayloadPathError", "PayloadRoot"),
    "payloadrun.reader": ("PayloadReader", "SegmentOverlapError", "ShortReadError", "read_field"),
    "payloadrun.segments": (
        "MASK_PAD",
        "ROUTED_EXPERTS",
        "ROUTING_FILL",
        "SAMPLING_MASK",
        "Segment",
        "SegmentError",
        "clip_all",
        "files_of",
        "segments_from_json",
        "segments_to_json",
    ),
    "payloadrun.store": ("PayloadStore", "PayloadWriteError"),
    "payloadrun.version": ("__version__",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'payloadrun' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from payloadrun.codec import (
        CodecError,
        PositionedRows,
        compact_routed_experts,
        decode_routed_experts,
        decode_sampling_mask,
        mask_rows,
        mask_rows_from_csr,
        routing_pos,
        routing_rows,
    )
    from payloadrun.paths import PayloadFile, PayloadPathError, PayloadRoot
    from payloadrun.reader import PayloadReader, SegmentOverlapError, ShortReadError, read_field
    from payloadrun.segments import (
        MASK_PAD,
        ROUTED_EXPERTS,
        ROUTING_FILL,
        SAMPLING_MASK,
        Segment,
        SegmentError,
        clip_all,
        files_of,
        segments_from_json,
        segments_to_json,
    )
    from payloadrun.store import PayloadStore, PayloadWriteError
    from payloadrun.version import __version__


__all__ = [
    "MASK_PAD",
    "ROUTED_EXPERTS",
    "ROUTING_FILL",
    "SAMPLING_MASK",
    "CodecError",
    "PayloadFile",
    "PayloadPathError",
    "PayloadReader",
    "PayloadRoot",
    "PayloadStore",
    "PayloadWriteError",
    "PositionedRows",
    "Segment",
    "SegmentError",
    "SegmentOverlapError",
    "ShortReadError",
    "__version__",
    "clip_all",
    "compact_routed_experts",
    "decode_routed_experts",
    "decode_sampling_mask",
    "files_of",
    "mask_rows",
    "mask_rows_from_csr",
    "read_field",
    "routing_pos",
    "routing_rows",
    "segments_from_json",
    "segments_to_json",
]
