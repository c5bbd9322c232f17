"""How an orchestrator and a trainer use payloads by handle, in prime-rl's shape.

Run it where the operator's environment is set (or set it yourself):

    PAYLOAD_ROOT               the run's payload root on the shared volume
    PAYLOADRUN_INFERENCE_URL   the writer sidecar in front of vLLM (the inference Service)
    PAYLOADRUN_RETENTION_URL   the retention sidecar on the orchestrator pod's loopback

    python examples/orchestrator_trainer.py

One step of the loop: the orchestrator asks for 4 rollouts at policy version 0, each request
naming ``payload_dir = <root>/v0``; the writer answers with segments instead of inline arrays. The
orchestrator clips them to each training sample and adds the final token's row (handles only: no
bytes move), records the batch with the retention sidecar, the trainer reads the rows, and once
the new policy is out the orchestrator reports it: the batch's files are deleted.

Every name it takes from payloadrun is the package's public API, ``import payloadrun`` (see
``help(payloadrun)``); tests/dataplane/test_public_api.py keeps it so.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from dataclasses import dataclass

from payloadrun import (
    PAYLOAD_DIR_ARG,
    ROUTED_EXPERTS,
    SAMPLING_MASK,
    Env,  # the names of the variables the operator sets
    PayloadReader,
    RetentionClient,
    Segment,
    choice_segments,
    files_of,
    payload_dir,
    sample_segments,
)


@dataclass
class Sample:
    prompt_len: int
    completion_len: int
    segments: list[Segment]

    @property
    def total(self) -> int:
        return self.prompt_len + self.completion_len


def generate(inference_url: str, prompt_ids: list[int], directory: str) -> tuple[list[int], list]:
    """A tokens-in generate request through the writer, asking for the payloads by handle."""
    body = {
        "model": "policy",
        "token_ids": prompt_ids,
        "sampling_params": {
            "max_tokens": 32,
            "temperature": 1.0,
            "extra_args": {PAYLOAD_DIR_ARG: directory},  # vLLM: SamplingParams.extra_args
        },
    }
    request = urllib.request.Request(
        f"{inference_url}/inference/v1/generate",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        choice = json.loads(response.read())["choices"][0]
    segments = choice_segments(choice)
    if segments is None:  # the writer could not store it (see X-Payloadrun-Fallback)
        raise SystemExit(f"the writer answered inline, not by handle: {sorted(choice)}")
    return choice["token_ids"], segments


def main() -> int:
    root = os.environ[Env.PAYLOAD_ROOT]
    inference_url = os.environ[Env.INFERENCE_URL].rstrip("/")
    retention = RetentionClient()  # Env.RETENTION_URL
    step, version = 1, 0

    # --- orchestrator: rollouts at policy v0, one training sample each -------------------------
    samples = []
    for i in range(4):
        prompt = [1000 + i * 7 + t for t in range(40)]
        completion, segments = generate(inference_url, prompt, payload_dir(root, version))
        samples.append(
            Sample(
                len(prompt),
                len(completion),
                sample_segments(segments, len(prompt), len(completion)),
            )
        )
    batch_files = sorted({f for s in samples for f in files_of(s.segments)})
    retention.record_batch(step, batch_files)  # after the batch is sent to the trainer

    # --- trainer: read the batch in full ----------------------------------------------------
    with PayloadReader(root) as reader:
        for s in samples:
            routing = reader.read(s.segments, ROUTED_EXPERTS, 0, s.total)
            mask = reader.read(s.segments, SAMPLING_MASK, s.prompt_len, s.total)
            # routing: [tokens, layers, top_k] uint8/uint16, one row per token of the sample;
            # mask: [completion tokens, widest], int32 ids padded with -1
            assert routing.shape[0] == s.total and mask.shape[0] == s.completion_len
            print(f"sample of {s.total} tokens: routing {routing.shape} {routing.dtype}, "
                  f"mask {mask.shape}")  # fmt: skip

    # --- orchestrator, after inference loaded v{step}: the batch's files can go --------------
    retention.policy_updated(step)
    print(f"batch {step}: {len(batch_files)} payload files recorded, read, and released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
