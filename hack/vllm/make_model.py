"""Makes the tiny Qwen3-MoE that the writer's real-vLLM tests serve, into the directory given.

Run with the vLLM environment's python (hack/vllm.sh does): it uses the transformers and tokenizers
that come with vLLM, needs no model hub, and writes the same model every time (fixed seed).

The model is the smallest MoE that vLLM's CPU build serves with the routing code of the real one
(Qwen3-MoE: 2 layers, hidden size 128, 8 experts, top-2, head_dim 64 as the CPU attention kernels
want), with random weights: the tests check the wire format, not the text. Its tokenizer is
word-level: ``w<i>`` is token ``i`` (so prompts and token ids in the tests name each other), then
the few words and special tokens of a chat template.

    python make_model.py <dir>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 512
EXTRA_WORDS = ["user", "assistant", "system", "<unk>", "<pad>"]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = VOCAB - len(EXTRA_WORDS) - len(SPECIAL)  # w0 .. w503 are ids 0 .. 503
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def vocabulary() -> dict[str, int]:
    words = [f"w{i}" for i in range(WORDS)] + EXTRA_WORDS + SPECIAL
    return {word: i for i, word in enumerate(words)}


def make(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

    vocab = vocabulary()
    assert len(vocab) == VOCAB  # every id the model can sample decodes to a word
    eos = vocab["<|im_end|>"]

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<|im_end|>",
        additional_special_tokens=[s for s in SPECIAL if s != "<|im_end|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    config = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=vocab["<|endoftext|>"],
        eos_token_id=eos,
        pad_token_id=vocab["<pad>"],
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).to(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # the chat template also as a file of its own, where recent transformers look first
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (out / "payloadrun-model.json").write_text(
        json.dumps({"words": WORDS, "vocab": len(vocab), "eos_token_id": eos}, indent=2) + "\n"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    make(Path(sys.argv[1]))
