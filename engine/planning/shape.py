"""``ModelShape``: the dimensions of a model that drive its memory use, and the bytes its KV takes.

The planner (``engine.planning.planner``) turns these counts into a plan; the cache and the benchmarks use the
same counts, so what is planned is what the homes hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InputError
from ..kv.disk_stream import NUM_PIECES, PIECE_BYTES, WRITES_PER_GROUP
from .window import trained_window


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that drive its memory use."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int
    num_params: int
    sliding_windows: tuple[int | None, ...]
    max_positions: int | None = None  # the trained context window (see ``trained_window``); None: unknown
    # Hybrid models: the model's layers that keep a fixed-size state (linear attention, convolution) instead of
    # per-token K/V. ``num_layers`` and ``sliding_windows`` count only the layers with K/V.
    state_layers: tuple[int, ...] = ()
    attn_softcap: bool = False  # attention logits are softcapped (Gemma 2): without flash-attn, the tiled path
    # The loaded weights' bytes where they are not num_params x dtype_bytes (int8 codes, a GGUF file's blocks).
    weight_bytes: int | None = None
    # Models whose layers differ in KV shape (Gemma 4: global layers with their own head_dim and KV heads): each
    # KV layer's KV heads and head_dim, in ``kv_layer_indices`` order; empty: every layer has ``num_kv_heads`` x
    # ``head_dim`` (for such models those two are the largest of any layer's, what buffers are sized by).
    layer_kv_heads: tuple[int, ...] = ()
    layer_head_dims: tuple[int, ...] = ()
    # KV sharing (Gemma 4's last layers): (consumer layer, producer layer), model indices. A consumer keeps no K/V
    # of its own; it attends its producer's with its own queries, so its KV is counted once, the producer's.
    shared_layers: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_config(cls, config, dtype_bytes: int = 2, num_params: int | None = None) -> ModelShape:
        """Builds a shape from a transformers config (llama, mistral, qwen2/3, gemma2/3).

        ``num_params`` is estimated from the config when not given.
        """
        if hasattr(config, "get_text_config"):  # multimodal wrappers nest the LM config
            config = config.get_text_config()
        layers = int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        types = layer_types(config)
        state = tuple(i for i, t in enumerate(types) if t in STATE_LAYER_TYPES)
        shared = shared_kv_layers(config)
        skipped = set(state) | {consumer for consumer, _ in shared}
        kept = [i for i in range(layers) if i not in skipped]
        dims = [layer_kv_shape(config, i) for i in kept]  # (KV heads, head_dim) of each layer with K/V
        if not dims:
            raise InputError(unsupported_layers(config) or "it has no attention layer at all: there is no K/V to keep")
        kv_heads, head_dim = max(d[0] for d in dims), max(d[1] for d in dims)
        uniform = len(set(dims)) == 1
        windows = tuple(w for i, w in enumerate(_sliding_windows(config, layers)) if i not in skipped)
        params = num_params if num_params is not None else _estimate_params(config, head_dim, kv_heads)
        return cls(len(windows), heads, kv_heads, head_dim, int(config.hidden_size), int(config.intermediate_size),
                   int(config.vocab_size), dtype_bytes, int(params), windows, trained_window(config), state,
                   bool(getattr(config, "attn_logit_softcapping", None)),
                   layer_kv_heads=() if uniform else tuple(d[0] for d in dims),
                   layer_head_dims=() if uniform else tuple(d[1] for d in dims), shared_layers=shared)

    @property
    def weights_bytes(self) -> int:
        """What the weights take: as loaded where known, else every parameter in ``dtype_bytes``."""
        return self.weight_bytes if self.weight_bytes is not None else self.num_params * self.dtype_bytes

    @property
    def kv_layer_indices(self) -> tuple[int, ...]:
        """The model's layer index of each layer with K/V, in order (all of them unless the model is hybrid or
        shares K/V across layers)."""
        skipped = set(self.state_layers) | {consumer for consumer, _ in self.shared_layers}
        return tuple(i for i in range(self.num_layers + len(skipped)) if i not in skipped)

    @property
    def kv_heads(self) -> tuple[int, ...]:
        """Each KV layer's KV heads (``kv_layer_indices`` order)."""
        return self.layer_kv_heads or (self.num_kv_heads,) * self.num_layers

    @property
    def head_dims(self) -> tuple[int, ...]:
        """Each KV layer's head_dim."""
        return self.layer_head_dims or (self.head_dim,) * self.num_layers

    @property
    def is_uniform(self) -> bool:
        """Every KV layer has the same KV heads and head_dim."""
        return not self.layer_kv_heads and not self.layer_head_dims

    @property
    def layer_kv_elements(self) -> tuple[int, ...]:
        """K (or V) elements of one token of each KV layer: KV heads x head_dim."""
        return tuple(h * d for h, d in zip(self.kv_heads, self.head_dims))

    @property
    def total_kv_heads(self) -> int:
        """KV heads summed over the KV layers."""
        return sum(self.kv_heads)

    @property
    def min_kv_heads(self) -> int:
        """The fewest KV heads of any KV layer: its query heads per KV head are the most (GQA expansion)."""
        return min(self.kv_heads)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V bytes of one token across all layers and KV heads (shared layers counted once, their
        producer's)."""
        return sum(self.layer_kv_elements) * 2 * self.dtype_bytes

    def groups_per_layer(self, group: int) -> tuple[int, ...]:
        """Head groups of ``group`` KV heads in each KV layer (``group`` divides every layer's KV heads)."""
        return tuple(h // group for h in self.kv_heads)


#: transformers layer types the head-wise cache holds per-token K/V for.
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
#: Layer types with a fixed-size state that stays on the compute device (no homes, no fetches).
STATE_LAYER_TYPES = frozenset({"linear_attention", "conv"})


def layer_types(config) -> tuple[str, ...]:
    """transformers' type of each decoder layer (``config.layer_types``; every layer full attention without it)."""
    types = getattr(config, "layer_types", None)
    return tuple(types) if types else ("full_attention",) * int(config.num_hidden_layers)


def layer_kv_shape(config, layer: int) -> tuple[int, int]:
    """(KV heads, head_dim) of decoder layer ``layer``: transformers' per-layer config where the model has one
    (Gemma 4's global layers have their own), else the config's."""
    per_layer = getattr(config, "per_layer_config", None)
    source = per_layer[layer] if per_layer is not None else config
    heads = int(config.num_attention_heads)
    kv_heads = getattr(source, "num_key_value_heads", None) or heads
    head_dim = getattr(source, "head_dim", None) or config.hidden_size // heads
    return int(kv_heads), int(head_dim)


def shared_kv_layers(config) -> tuple[tuple[int, int], ...]:
    """(consumer, producer) of every layer that reuses another layer's K/V (``kv_sharing_modes`` "reuse": the
    last non-consumer layer of the same type produces it, as transformers' Gemma 4 hands it on)."""
    try:
        modes = getattr(config, "kv_sharing_modes", None)
    except ValueError as exc:  # (transformers refuses shared types that no layer produces)
        raise InputError(str(exc)) from exc
    if modes is None:
        return ()
    types = layer_types(config)
    pairs = []
    for consumer, mode in enumerate(modes):
        if mode != "reuse":
            continue
        producer = next((i for i in range(consumer - 1, -1, -1) if modes[i] != "reuse" and types[i] == types[consumer]),
                        None)
        if producer is None:
            raise InputError(f"layer {consumer} reuses K/V, but no earlier layer of its type produces any")
        pairs.append((consumer, producer))
    return tuple(pairs)


def unsupported_layers(config) -> str | None:
    """Why the engine cannot serve ``config``'s layers exactly, or None when it can."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    if getattr(config, "use_bidirectional_attention", None) == "all":
        return "its attention is bidirectional (use_bidirectional_attention='all'), not causal"
    try:
        shared_kv_layers(config)
    except InputError as exc:
        return str(exc)
    odd = sorted(set(layer_types(config)) - ATTENTION_LAYER_TYPES - STATE_LAYER_TYPES)
    if odd:
        return (f"its layer types {odd} are not plain attention or a fixed-size state (e.g. one layer holding both "
                "attention K/V and a recurrent state, or chunked/indexed attention)")
    if all(t in STATE_LAYER_TYPES for t in layer_types(config)):
        return "it has no attention layer at all: there is no K/V to keep"
    return None


def _sliding_windows(config, layers: int) -> tuple[int | None, ...]:
    window = getattr(config, "sliding_window", None)
    # Qwen2/3 keep a sliding_window value around even when the feature is off.
    if getattr(config, "use_sliding_window", True) is False or not window:
        return (None,) * layers
    types = getattr(config, "layer_types", None)
    if types is None:  # mistral: one window for every layer
        return (int(window),) * layers
    return tuple(int(window) if t == "sliding_attention" else None for t in types)


def _estimate_params(config, head_dim: int, kv_heads: int) -> int:
    if getattr(config, "model_type", "") == "gemma4_text":
        return _gemma4_params(config)
    hidden, heads = config.hidden_size, config.num_attention_heads
    embed = config.vocab_size * hidden
    lm_head = 0 if getattr(config, "tie_word_embeddings", False) else embed
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    attn = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
    model_type = getattr(config, "model_type", "")
    if model_type in ("qwen2", "qwen2_moe") or getattr(config, "attention_bias", False):
        attn += q_out + 2 * kv_out  # q/k/v biases (Qwen2 and Qwen2-MoE always have them)
    if model_type in ("qwen3", "qwen3_moe", "gemma3_text"):
        attn += 2 * head_dim  # q_norm / k_norm
    norms = (4 if model_type in ("gemma2", "gemma3_text") else 2) * hidden  # gemma adds post-norms
    dense = 3 * hidden * config.intermediate_size
    sparse = _experts_params(config, hidden)
    layers = config.num_hidden_layers
    if sparse is None:
        return embed + lm_head + layers * (attn + dense + norms) + hidden
    # Mixture of experts: every expert's weights are loaded (only a few run per token).
    num_sparse = _sparse_layers(config)
    return embed + lm_head + layers * (attn + norms) + num_sparse * sparse + (layers - num_sparse) * dense + hidden


def _gemma4_params(config) -> int:
    """Gemma 4's parameters: per-layer attention shapes (global layers' head_dim and KV heads, no V projection
    where K is V, none of K/V in a consumer layer), a dense MLP beside the optional experts, per-layer inputs."""
    hidden, heads, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    consumers = {consumer for consumer, _ in shared_kv_layers(config)}
    types = layer_types(config)
    total = config.vocab_size * hidden + hidden  # tied embedding, final norm
    ple = config.hidden_size_per_layer_input or 0
    if ple:
        total += config.vocab_size_per_layer_input * layers * ple + hidden * layers * ple + ple
    for layer in range(layers):
        kv_heads, dim = layer_kv_shape(config, layer)
        attn = 2 * hidden * heads * dim + dim  # q, o, q_norm
        if layer not in consumers:
            k_is_v = config.attention_k_eq_v and types[layer] != "sliding_attention"
            attn += hidden * kv_heads * dim * (1 if k_is_v else 2) + dim
        wide = 2 if config.use_double_wide_mlp and layer in consumers else 1
        mlp = 3 * hidden * config.intermediate_size * wide + 4 * hidden
        if config.enable_moe_block:
            experts = config.num_experts
            mlp += experts * 3 * hidden * config.moe_intermediate_size + hidden * experts + hidden + experts
            mlp += 3 * hidden
        if ple:
            mlp += 2 * hidden * ple + hidden
        total += attn + mlp
    return total


def _sparse_layers(config) -> int:
    """The layers with experts: Qwen-MoE may keep some dense (``mlp_only_layers``, or all but every
    ``decoder_sparse_step``-th); Gemma 4 has them beside the MLP of every layer where ``enable_moe_block``."""
    if getattr(config, "model_type", "") in ("gemma4", "gemma4_text"):
        return config.num_hidden_layers if getattr(config, "enable_moe_block", False) else 0
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense_only = set(getattr(config, "mlp_only_layers", None) or ())
    return sum(1 for i in range(config.num_hidden_layers) if i not in dense_only and (i + 1) % step == 0)


def fused_experts_params(config) -> int:
    """The routed experts' weights of every MoE layer (transformers 5 fuses each layer's into 3-D parameters): what
    the quantized weights modes hold apart (``engine.models.quantized.held_weight_bytes``' ``experts``)."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if not experts:
        return 0
    size = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    return _sparse_layers(config) * experts * 3 * config.hidden_size * size


def _experts_params(config, hidden: int) -> int | None:
    """A mixture-of-experts layer's feed-forward parameters (experts, router, shared expert), or None if dense."""
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if not experts:
        return None
    size = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
    shared_gate = hidden if shared else 0  # (Qwen2-MoE gates its shared expert with one more projection)
    return experts * 3 * hidden * size + experts * hidden + 3 * hidden * shared + shared_gate


def stored_tokens(shape: ModelShape, context: int, chunk: int) -> int:
    """Tokens of K/V the homes hold summed over layers: a sliding-window layer keeps a ring of its window
    plus one chunk, a full-attention layer every token."""
    return sum(context if w is None else min(context, w - 1 + chunk) for w in shape.sliding_windows)


def host_element_bytes(shape: ModelShape, kv_dtype: str | None, head_dim: int | None = None) -> float:
    """Host bytes per K or V element: the model's dtype, or 1 byte plus a 4-byte scale per head for 8-bit KV
    (``head_dim``: a layer's; default the shape's largest)."""
    return float(shape.dtype_bytes) if kv_dtype is None else 1.0 + 4.0 / (head_dim or shape.head_dim)


def host_layer_token_bytes(shape: ModelShape, kv_dtype: str | None) -> tuple[float, ...]:
    """Host bytes of one token's K and V in each KV layer, as its homes in RAM store them."""
    return tuple(e * 2 * host_element_bytes(shape, kv_dtype, d) for e, d in zip(shape.layer_kv_elements,
                                                                               shape.head_dims))


def stored_kv_bytes(shape: ModelShape, context: int, chunk: int, kv_dtype: str | None) -> int:
    """Bytes the homes of every KV layer hold at ``context`` as stored in RAM (8-bit: with their scales): each
    layer's tokens (``stored_tokens``) at its own KV heads x head_dim."""
    per_token = host_layer_token_bytes(shape, kv_dtype)
    return int(sum(b * (context if w is None else min(context, w - 1 + chunk))
                   for b, w in zip(per_token, shape.sliding_windows)))


def disk_stream_bytes(shape: ModelShape, chunk: int, kv_dtype: str | None) -> int:
    """Pinned host memory the disk tier moves through on CUDA: the disk stream's pieces and write buffers
    (``WRITES_PER_GROUP`` per head group of a layer, each one chunk of that group: per layer, every KV head)."""
    # Imported here: the KV core imports PlanError from the planner, which imports this module.

    per_token = max(shape.layer_kv_elements) * 2 * math.ceil(host_element_bytes(shape, kv_dtype))
    return NUM_PIECES * PIECE_BYTES + WRITES_PER_GROUP * chunk * per_token
