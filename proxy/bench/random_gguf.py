"""Random-weight GGUF files of a Qwen2 shape: timings of a model without downloading its weights.

A decoder's speed depends on its shape and quantisation, not on the values of its weights, so a
GPU's verification cost curve can be measured on a machine that reaches no model hub. Every matrix
is Q4_K (the bulk of a Q4_K_M file) filled with random blocks whose scales are small and finite;
norms are ones and biases zeros. The tokenizer is copied from any GGUF that has one (llama.cpp's
vocabulary-only `ggml-vocab-qwen2.gguf` will do), and the vocabulary size follows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

Q4_K_BLOCK_VALUES, Q4_K_BLOCK_BYTES = 256, 144  # llama.cpp's block_q4_K: d, dmin (f16), 12 scale bytes, 128 nibbles
TOKENIZER_PREFIX = "tokenizer."


@dataclass(frozen=True)
class Qwen2Shape:
    """The hyper-parameters that set a Qwen2 decoder's cost."""

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    tied_output: bool  # the output projection reuses the token embedding (small Qwen2.5 models)

    @property
    def kv_width(self) -> int:
        return self.hidden // self.heads * self.kv_heads


QWEN25_7B = Qwen2Shape("qwen2.5-7b-shape", layers=28, hidden=3584, ffn=18944, heads=28, kv_heads=4, tied_output=False)
QWEN25_05B = Qwen2Shape("qwen2.5-0.5b-shape", layers=24, hidden=896, ffn=4864, heads=14, kv_heads=2, tied_output=True)


class _RandomBlocks:
    """One pool of random Q4_K blocks that every matrix takes a view of (values never matter, bytes do)."""

    def __init__(self, largest_blocks: int, seed: int = 0) -> None:
        pool = np.random.default_rng(seed).integers(0, 256, size=(largest_blocks, Q4_K_BLOCK_BYTES), dtype=np.uint8)
        # Scales d = 2^-9 and dmin = 2^-10 keep activations finite through every layer.
        pool[:, 0:2] = np.array([2.0 ** -9], dtype=np.float16).view(np.uint8)
        pool[:, 2:4] = np.array([2.0 ** -10], dtype=np.float16).view(np.uint8)
        self._pool = pool

    def matrix(self, rows: int, columns: int) -> np.ndarray:
        """Q4_K bytes of a rows x columns matrix (numpy order: columns is llama.cpp's ne0)."""
        if columns % Q4_K_BLOCK_VALUES:
            raise ValueError(f"a Q4_K row needs a multiple of {Q4_K_BLOCK_VALUES} values, not {columns}")
        blocks = rows * columns // Q4_K_BLOCK_VALUES
        return self._pool[:blocks].reshape(rows, columns // Q4_K_BLOCK_VALUES * Q4_K_BLOCK_BYTES)


def write_random_qwen2(path: Path, shape: Qwen2Shape, tokenizer_gguf: Path, *, context: int = 32768) -> Path:
    """Write a random-weight Qwen2 GGUF of `shape` to path, with the tokenizer of tokenizer_gguf."""
    import gguf  # a benchmark-only dependency

    source = gguf.GGUFReader(str(tokenizer_gguf))
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name(shape.name)
    writer.add_context_length(context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    _copy_tokenizer(source, writer)

    blocks = _RandomBlocks(max(vocab * shape.hidden, shape.ffn * shape.hidden) // Q4_K_BLOCK_VALUES)
    q4k = gguf.GGMLQuantizationType.Q4_K

    def matrix(name: str, rows: int, columns: int) -> None:
        writer.add_tensor(name, blocks.matrix(rows, columns), raw_dtype=q4k)

    def vector(name: str, size: int, value: float) -> None:
        writer.add_tensor(name, np.full(size, value, dtype=np.float32))

    matrix("token_embd.weight", vocab, shape.hidden)
    vector("output_norm.weight", shape.hidden, 1.0)
    if not shape.tied_output:
        matrix("output.weight", vocab, shape.hidden)
    for layer in range(shape.layers):
        block = f"blk.{layer}"
        vector(f"{block}.attn_norm.weight", shape.hidden, 1.0)
        matrix(f"{block}.attn_q.weight", shape.hidden, shape.hidden)
        vector(f"{block}.attn_q.bias", shape.hidden, 0.0)
        matrix(f"{block}.attn_k.weight", shape.kv_width, shape.hidden)
        vector(f"{block}.attn_k.bias", shape.kv_width, 0.0)
        matrix(f"{block}.attn_v.weight", shape.kv_width, shape.hidden)
        vector(f"{block}.attn_v.bias", shape.kv_width, 0.0)
        matrix(f"{block}.attn_output.weight", shape.hidden, shape.hidden)
        vector(f"{block}.ffn_norm.weight", shape.hidden, 1.0)
        matrix(f"{block}.ffn_gate.weight", shape.ffn, shape.hidden)
        matrix(f"{block}.ffn_up.weight", shape.ffn, shape.hidden)
        matrix(f"{block}.ffn_down.weight", shape.hidden, shape.ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _copy_tokenizer(source, writer) -> None:  # gguf.GGUFReader, gguf.GGUFWriter
    """Copy every tokenizer.* field of source into writer, types kept."""
    import gguf

    for name, field in source.fields.items():
        if not name.startswith(TOKENIZER_PREFIX):
            continue
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type)
