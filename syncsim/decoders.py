"""Decoder-only transformers of the Llama kind, from their published configurations: tensor shapes,
bytes per FSDP unit, training FLOPs per token and activation bytes."""

from __future__ import annotations

import math

from syncsim.units import FP32_BYTES

__all__ = ["LLAMA2_7B", "DECODERS", "decoder_params", "decoder_layers", "decoder_train_flops_per_token",
           "llama_shapes", "llama_layers", "llama_train_flops_per_token", "llama_activation_bytes"]

# Llama 2 7B (Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models"), from its published
# configuration (meta-llama/Llama-2-7b-hf, config.json): hidden 4096, intermediate 11008, 32 layers, 32 heads
# of 128, vocabulary 32000, 4096-token context, untied input and output embeddings, RMSNorm; no biases.
LLAMA2_7B = dict(hidden=4096, intermediate=11008, layers=32, heads=32, vocab=32000, context=4096)

# Decoder-only transformers of the Llama kind (RMSNorm, SwiGLU MLP, rotary attention, untied embeddings), each from
# its published configuration; ``kv_heads`` is grouped-query attention's key/value heads (None: one per query head),
# ``qkv_bias`` whether the q, k and v projections carry biases, ``context`` the sequence the preset trains on.
# - llama2-7b: above. llama2-13b: meta-llama/Llama-2-13b-hf config.json (hidden 5120, intermediate 13824, 40 layers,
#   40 heads, vocabulary 32000); llama2-70b: meta-llama/Llama-2-70b-hf config.json (8192, 28672, 80 layers, 64 heads,
#   8 key/value heads). Touvron et al. 2023 table 1 give the 4k context and grouped-query attention for 70B only.
# - llama3.1-8b: torchtitan's llama3 "8B" (torchtitan/models/llama/__init__.py at pytorch/torchtitan 003aa07e: dim
#   4096, 32 layers, 32 heads, 8 key/value heads, ffn_dim_multiplier 1.3, multiple_of 1024, which its FeedForward
#   rounds to an intermediate of 14336) and meta-llama/Llama-3.1-8B config.json ("intermediate_size": 14336,
#   "vocab_size": 128256, "tie_word_embeddings": false): 8,030,261,248 parameters. Llama 3 8B is the same network.
#   llama3-70b: the same sources' "70B" (dim 8192, 80 layers, 64 heads, 8 key/value heads, intermediate 28672).
# - qwen2.5-7b: Qwen/Qwen2.5-7B config.json (hidden 3584, intermediate 18944, 28 layers, 28 heads, 4 key/value
#   heads, vocabulary 152064, untied, biases on q, k and v): 7,615,616,512 parameters, 6,525,618,176 outside the
#   two embeddings, the model card's "7.61B" and "6.53B (non-embedding)".
DECODERS: dict[str, dict] = {
    "llama2-7b": LLAMA2_7B,
    "llama2-13b": dict(hidden=5120, intermediate=13824, layers=40, heads=40, vocab=32000, context=4096),
    "llama2-70b": dict(hidden=8192, intermediate=28672, layers=80, heads=64, kv_heads=8, vocab=32000, context=4096),
    "llama3.1-8b": dict(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=128256,
                        context=8192),
    "llama3-70b": dict(hidden=8192, intermediate=28672, layers=80, heads=64, kv_heads=8, vocab=128256, context=8192),
    "qwen2.5-7b": dict(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, vocab=152064,
                       context=2048, qkv_bias=True),
}


def llama_shapes(hidden: int, intermediate: int, layers: int, heads: int, vocab: int, context: int,
                 kv_heads: int | None = None, qkv_bias: bool = False) -> tuple:
    # As the reference implementation registers them (torch's (out, in) layout): the token embedding, per
    # block q, k, v, o projections (k and v of kv_heads heads), the q, k, v biases where the model has them, the
    # SwiGLU MLP's gate, up and down projections, the two RMSNorm weights; the final norm and the output layer.
    # 6,738,415,616 values for Llama 2 7B, its published "7B" (6.74e9).
    kv = (kv_heads or heads) * (hidden // heads)
    attention = ((hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden))
    biases = ((hidden,), (kv,), (kv,)) if qkv_bias else ()
    block = attention + biases + ((intermediate, hidden), (intermediate, hidden), (hidden, intermediate),
                                  (hidden,), (hidden,))
    return ((vocab, hidden), *(block * layers), (hidden,), (vocab, hidden))


def llama_layers(hidden: int, intermediate: int, layers: int, heads: int, vocab: int, context: int,
                 kv_heads: int | None = None, qkv_bias: bool = False) -> tuple:
    # fp32 bytes of the embedding, each transformer block, and the final norm with the output layer: what
    # FSDP wraps as units (torchtitan wraps each block) and DDP fills buckets from.
    kv = (kv_heads or heads) * (hidden // heads)
    block = (2 * hidden * hidden + 2 * kv * hidden + (hidden + 2 * kv if qkv_bias else 0)
             + 3 * intermediate * hidden + 2 * hidden)
    return (float(FP32_BYTES * vocab * hidden), *(float(FP32_BYTES * block),) * layers,
            float(FP32_BYTES * (hidden + vocab * hidden)))


def llama_train_flops_per_token(hidden: int, intermediate: int, layers: int, heads: int, vocab: int,
                                context: int, kv_heads: int | None = None, qkv_bias: bool = False) -> float:
    # PaLM's count (Chowdhery et al. 2022, appendix B): 6N + 12·L·H·Q·T per token, N the parameters that take
    # part in matrix products (all but the input embedding, a lookup; the untied output layer is a product),
    # L layers, H query heads of Q dimensions, T the sequence: 46.09e9 for Llama 2 7B at 4096 tokens (6N alone:
    # 39.6e9). Grouped-query attention shrinks k and v (counted in N) but not the H·Q of the attention scores.
    # Cross-check: Llama 2's 184,320 A100 GPU-hours for 2.0T tokens (Touvron et al. 2023, tables 1
    # and 2) are 3,014 tokens/s per GPU, 44.5 % of the A100's peak by this count, end to end.
    shapes = llama_shapes(hidden, intermediate, layers, heads, vocab, context, kv_heads, qkv_bias)
    n = sum(math.prod(shape) for shape in shapes) - vocab * hidden
    return 6 * n + 12 * layers * heads * (hidden // heads) * context


def decoder_params(name: str) -> int:
    """Parameters of the decoder ``name`` (a key of ``DECODERS``), embeddings included."""
    return sum(math.prod(shape) for shape in llama_shapes(**_decoder(name)))


def decoder_layers(name: str) -> tuple[float, ...]:
    """fp32 bytes of the decoder's embedding, each block, and its final norm with the output layer."""
    return llama_layers(**_decoder(name))


def decoder_train_flops_per_token(name: str, seq_len: int) -> float:
    """Training FLOPs per token of the decoder at sequence length ``seq_len``: PaLM's 6N + 12·L·H·Q·T."""
    return llama_train_flops_per_token(**(_decoder(name) | {"context": seq_len}))


def _decoder(name: str) -> dict:
    if name not in DECODERS:
        raise ValueError(f"unknown decoder {name!r}; choose one of {', '.join(sorted(DECODERS))}")
    return DECODERS[name]


def llama_activation_bytes(hidden: int, intermediate: int, layers: int, heads: int, vocab: int,
                           context: int) -> float:
    # Activations one sequence keeps for backward in 16-bit, counted tensor by tensor as Korthikanti et al.
    # 2022 (section 4.1) count a GPT layer's (34·s·h + 5·a·s² bytes), applied to Llama's block (s the
    # sequence, h hidden, i intermediate): attention 10·s·h (the q/k/v projections' input; Q and K after
    # rotary embedding, V and the output O, which FlashAttention keeps instead of the s × s scores; O is also
    # the output projection's input); SwiGLU MLP 2·s·h + 8·s·i (its input; gate, SiLU(gate), up and their
    # product, the down projection's input); two RMSNorm inputs 4·s·h; no dropout. After the blocks: the final
    # norm's and the output layer's inputs (4·s·h) and one fp32 copy of the logits for the loss (4·s·V). For
    # Llama 2 7B, 20.72e9 bytes (19.3 GiB) per 4096-token sequence. An estimate of ours, not a measurement.
    s, h, i = context, hidden, intermediate
    per_layer = 10 * s * h + (2 * s * h + 8 * s * i) + 4 * s * h
    return float(layers * per_layer + 4 * s * h + 4 * s * vocab)
