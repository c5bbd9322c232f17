"""``payloadrun roundtrip``: one vLLM-sized response taken inline, moved by handle, read back.

It builds the inline response a vLLM server with router replay and sampling masks would send for
one long rollout (Qwen3-30B-A3B shape by default: 48 MoE layers, top-8 routing, 384 B/token),
writes its arrays through the store, reads them back through the reader as a trainer would, checks
they are bitwise equal, and prints what went over the wire each way.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from payloadrun.codec import (
    decode_routed_experts,
    decode_sampling_mask,
    encode_npy_base64,
    encode_sampling_mask_csr,
    mask_rows,
    routing_rows,
)
from payloadrun.reader import PayloadReader
from payloadrun.segments import ROUTED_EXPERTS, SAMPLING_MASK, segments_to_json
from payloadrun.store import PayloadStore


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "roundtrip",
        help="move one vLLM-sized response by handle and back, and print the sizes",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--prompt-tokens", type=int, default=24_000)
    p.add_argument("--completion-tokens", type=int, default=8_000)
    p.add_argument("--layers", type=int, default=48, help="MoE layers")
    p.add_argument("--top-k", type=int, default=8, help="experts per token per layer")
    p.add_argument("--experts", type=int, default=128, help="experts per layer")
    p.add_argument("--mask-width", type=int, default=20, help="mean ids kept per token")
    p.add_argument("--root", type=Path, help="payload root (default: a temporary directory)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def inline_response(args: argparse.Namespace) -> dict:
    """A /generate-style choice as vLLM sends it inline: routing as base64 .npy, mask as CSR."""
    rng = np.random.default_rng(args.seed)
    forwarded = args.prompt_tokens + args.completion_tokens - 1
    experts = rng.integers(0, args.experts, (forwarded, args.layers, args.top_k), dtype=np.uint16)
    if args.experts <= 256:
        experts = experts.astype(np.uint8)
    counts = rng.integers(0, 2 * args.mask_width + 1, args.completion_tokens).astype(np.int32)
    ids = rng.integers(0, 150_000, int(counts.sum())).astype(np.int32)
    return {
        "routed_experts": encode_npy_base64(experts),
        "sampling_mask": encode_sampling_mask_csr(ids, counts),
    }


def run(args: argparse.Namespace) -> int:
    if args.prompt_tokens < 1 or args.completion_tokens < 1:
        raise SystemExit("--prompt-tokens and --completion-tokens must be at least 1")
    with tempfile.TemporaryDirectory(prefix="payloadrun-") as tmp:
        root = args.root or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        choice = inline_response(args)
        inline_bytes = len(json.dumps(choice))

        experts, _ = decode_routed_experts(choice["routed_experts"])
        ids, counts = decode_sampling_mask(choice["sampling_mask"])
        parts = [
            routing_rows(experts, args.prompt_tokens, args.completion_tokens),
            mask_rows(ids, counts, args.prompt_tokens),
        ]
        t0 = time.perf_counter()
        segments = PayloadStore(root).write(f"{root}/v0", parts)
        write_s = time.perf_counter() - t0
        handle_bytes = len(json.dumps({"payload": segments_to_json(segments)}))

        total = args.prompt_tokens + args.completion_tokens
        t0 = time.perf_counter()
        with PayloadReader(root) as reader:
            routing = reader.read(segments, ROUTED_EXPERTS, 0, total)
            mask = reader.read(segments, SAMPLING_MASK, args.prompt_tokens, total)
        read_s = time.perf_counter() - t0

        ok = np.array_equal(routing[: len(experts)], experts) and np.array_equal(
            mask, parts[1].rows
        )
        file_bytes = Path(segments[0].file).stat().st_size
        print(f"rollout: {args.prompt_tokens} prompt + {args.completion_tokens} completion tokens")
        print(f"inline response fields: {inline_bytes / 1e6:9.2f} MB")
        print(f"by-handle segments:     {handle_bytes / 1e6:9.4f} MB  ({handle_bytes} bytes)")
        print(f"on the wire:            {inline_bytes / handle_bytes:9.0f}x smaller by handle")
        print(f"payload file:           {file_bytes / 1e6:9.2f} MB  {segments[0].file}")
        print(f"write+fsync: {write_s * 1e3:.1f} ms   read back: {read_s * 1e3:.1f} ms")
        print(f"read back bitwise equal: {'yes' if ok else 'NO'}")
        return 0 if ok else 1
