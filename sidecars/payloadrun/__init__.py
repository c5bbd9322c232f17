"""payloadrun: MoE router-replay ids and sampling masks moved by handle through a shared volume.

The data-plane library: segments (the handles), the codec (vLLM's inline forms to payload rows),
the store (writes one file per request) and the reader (reads a field over a token range).
It imports neither torch nor a Kubernetes client.
"""

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
