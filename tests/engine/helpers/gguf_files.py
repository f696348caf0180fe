"""GGUF files for the tests, written by gguf-py's own ``GGUFWriter`` from a transformers config's shapes."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from gguf import GGUFWriter
from gguf_samples import SMALL, TYPES, blocks_of
from transformers import AutoModelForCausalLM

from engine.cpu.gguf_blocks import random_block_rows


def write_tiny_gguf(path, architecture: str, config, *, kv_heads_in_file: bool = True, blocks=None,
                    with_tokenizer: bool = False, leave_out: str | None = None) -> None:
    """A GGUF of ``config``'s shapes as llama.cpp names them (found by transformers' own full map), with the
    metadata transformers reads a config from; random Q8_0 matrices and fp32 vectors (both conversions read the
    same bytes, so the values need no meaning). ``blocks(name, data)``: another matrix's (raw, ggml type), else
    None; ``with_tokenizer``: a tiny byte-level BPE vocabulary, so that ``load_model`` reads the file whole;
    ``leave_out``: a GGUF tensor name the file lacks."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    names = {hf: gguf_name for gguf_name, hf in get_gguf_hf_weights_map(model, processor).items()}
    writer = GGUFWriter(str(path), architecture)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_embedding_length(config.hidden_size)
    writer.add_head_count(config.num_attention_heads)
    if kv_heads_in_file:
        writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(config.vocab_size)
    if getattr(config, "head_dim", None):
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    if getattr(config, "sliding_window", None):
        writer.add_sliding_window(config.sliding_window)
    if with_tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(["a", "b", "ab"] + [f"t{i}" for i in range(3, config.vocab_size)])
        writer.add_token_scores([0.0] * config.vocab_size)
        writer.add_token_merges(["a b"])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    rng = np.random.default_rng(0)
    for name, tensor in model.state_dict().items():
        if name not in names or names[name] == leave_out:
            continue  # a tied lm_head: the file holds the embedding once
        data = (rng.standard_normal(tuple(tensor.shape)) * 0.1).astype(np.float32)
        if blocks is not None and (chosen := blocks(names[name], data)) is not None:
            writer.add_tensor(names[name], chosen[0], raw_dtype=GGMLQuantizationType(chosen[1]))
        elif data.ndim == 2 and data.shape[1] % 32 == 0:
            writer.add_tensor(names[name], quantize(data, GGMLQuantizationType.Q8_0),
                              raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(names[name], data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def k_quant_blocks():
    """``write_tiny_gguf``'s ``blocks``: the matrices 256 wide cycle through every block type (gguf-py's own
    quantization for the small types, random blocks with small factors for the K types)."""
    kinds = itertools.cycle(sorted(TYPES))
    rng = np.random.default_rng(1)

    def blocks(name, data):
        if data.ndim != 2 or data.shape[1] % 256:
            return None
        kind = next(kinds)
        if kind in SMALL:
            return blocks_of(data, kind).numpy(), TYPES[kind]
        return random_block_rows(rng, TYPES[kind], *data.shape).numpy(), TYPES[kind]

    return blocks


#: (hidden, intermediate, layers, heads, KV heads, vocab) of real models, for ``header_only_gguf``
LLAMA_8B_SHAPE = (4096, 14336, 32, 32, 8, 128256)  # Llama 3.1 8B
SHAPE_27B = (5120, 17408, 64, 40, 8, 152064)  # a 27B-class dense shape: 22.7B weights, Qwen's vocabulary


def header_only_gguf(path, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int, *,
                     q4_k_m_tensors: bool = False):
    """A Llama-family GGUF of a real model's shape holding its metadata alone: what ``read_config`` and the
    ``auto`` rule read. ``q4_k_m_tensors``: with the tensor table of a Q4_K_M file (Q4_K matrices, Q6_K for the
    lm_head and every other layer's V and FFN down, fp32 norms) and the file's length (sparse: no data written, a
    complete download to discovery), what ``gguf_device_bytes`` counts."""
    from gguf import GGMLQuantizationType as Kind

    from engine.models.gguf_header import read_header

    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(131072)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_embedding_length(hidden)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500000.0)
    writer.add_vocab_size(vocab)
    if q4_k_m_tensors:
        kv = hidden // heads * kv_heads

        def matrix(name: str, out: int, inner: int, kind: Kind) -> None:  # [out, in], blocks of 256 along in
            writer.add_tensor_info(name, (out, inner), np.dtype(np.float32),
                                   out * inner // 256 * (144 if kind == Kind.Q4_K else 210), raw_dtype=kind)

        matrix("token_embd.weight", vocab, hidden, Kind.Q4_K)
        for i in range(layers):
            more_bits = Kind.Q6_K if i % 2 == 0 else Kind.Q4_K
            for name, out, inner, kind in (("attn_q", hidden, hidden, Kind.Q4_K), ("attn_k", kv, hidden, Kind.Q4_K),
                                           ("attn_v", kv, hidden, more_bits), ("attn_output", hidden, hidden, Kind.Q4_K),
                                           ("ffn_gate", intermediate, hidden, Kind.Q4_K),
                                           ("ffn_up", intermediate, hidden, Kind.Q4_K),
                                           ("ffn_down", hidden, intermediate, more_bits)):
                matrix(f"blk.{i}.{name}.weight", out, inner, kind)
            for norm in ("attn_norm", "ffn_norm"):
                writer.add_tensor_info(f"blk.{i}.{norm}.weight", (hidden,), np.dtype(np.float32), 4 * hidden)
        writer.add_tensor_info("output_norm.weight", (hidden,), np.dtype(np.float32), 4 * hidden)
        matrix("output.weight", vocab, hidden, Kind.Q6_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    if q4_k_m_tensors:
        header = read_header(path)
        with open(path, "r+b") as file:
            file.truncate(header.data_offset + header.data_bytes)
    return path
