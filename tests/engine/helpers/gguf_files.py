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
