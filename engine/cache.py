"""``HeadInferCache``: a transformers ``Cache`` whose layers keep K/V per (layer, head group) homes.

Use it with a model loaded with ``attn_implementation="headinfer"``::

    cache = HeadInferCache(model.config, chunk_size=4096)
    model.generate(ids, past_key_values=cache, prefill_chunk_size=4096)

``update`` appends a chunk's K/V to the homes (asynchronously to host memory on CUDA) and hands the chunk
back tagged with its layer; the registered attention function then reads the past group by group.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from . import attention
from .kv_store import HeadGroup, LayerStore
from .planner import ModelShape, Plan, make_plan
from .policy import OffloadPolicy
from .telemetry import detect_budgets
from .transfer import Transfer

logger = logging.getLogger(__name__)

_GROWTH_CAPACITY = 4096  # tokens allocated up front when no max_context was planned


class HeadInferLayer(CacheLayerMixin):
    """One decoder layer's view of the cache: its length, its window and its homes."""

    is_croppable = True

    def __init__(self, cache: "HeadInferCache", layer_idx: int, window: int | None):
        super().__init__()
        self.cache = cache
        self.layer_idx = layer_idx
        self.window = window
        self.is_sliding = window is not None
        self.store: LayerStore | None = None
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, _, _, head_dim = key_states.shape
        self.cache.allocate(batch, head_dim, key_states.dtype, key_states.device)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # key_states/value_states: [B, KVH, Q, D] for this chunk, on the compute device
        if not self.is_initialized or self.store is None:
            self.lazy_initialization(key_states, value_states)
        self.cache.check_attention(self.layer_idx)
        keys, values = key_states.contiguous(), value_states.contiguous()
        q_len = keys.shape[2]
        if self.store.homes[0].capacity < self.length + q_len:  # all homes share one capacity
            self.cache.reserve(self.length + q_len)
        for home in self.store.homes:
            self.cache.transfer.store(self.layer_idx, home, keys, values, self.length)
        self.length += q_len
        attention.mark_chunk(keys, self)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove; use HeadInferCache.crop_to(length)")
        self.length = max(0, self.length + tokens_to_remove)

    def reset(self) -> None:
        self.length = 0

    def offload(self) -> None:  # the attention loop moves data itself
        pass

    def prefetch(self) -> None:
        pass

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise ValueError("HeadInferCache does not support beam search; use greedy or sampling")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise ValueError("HeadInferCache does not support expanding the batch (num_return_sequences / beams)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise ValueError("HeadInferCache does not support selecting batch rows")


class HeadInferCache(Cache):
    """Exact KV cache kept per (layer, KV head group), mostly in host memory.

    Args:
        config: the model config (``model.config``).
        policy: an ``OffloadPolicy``; keyword arguments override its fields (``chunk_size=...``).
        device / dtype: where and in what the model computes; default: CUDA if available, the config dtype.
    """

    def __init__(self, config, policy: OffloadPolicy | None = None, *, device: str | torch.device | None = None,
                 dtype: torch.dtype | None = None, **policy_overrides):
        self.config = config
        text_config = config.get_text_config(decoder=True)
        self.policy = dataclasses.replace(policy or OffloadPolicy(), **policy_overrides)
        self.device = torch.device(device) if device is not None else _default_device()
        self.dtype = dtype or _config_dtype(text_config)
        self.shape = ModelShape.from_config(text_config, dtype_bytes=torch.tensor([], dtype=self.dtype).element_size())
        self.policy.validate_for(self.shape.num_kv_heads)
        layers = [HeadInferLayer(self, i, w) for i, w in enumerate(self.shape.sliding_windows)]
        super().__init__(layers=layers)
        self.transfer: Transfer | None = None
        self.plan: Plan = self._plan(self.policy.max_context or getattr(text_config, "max_position_embeddings", 8192))
        if self.policy.max_context is not None:
            # Refuse a context the machine cannot hold before a single byte is allocated.
            self.plan.require_fit()

    # -- allocation ------------------------------------------------------------------------------
    def _plan(self, context_tokens: int) -> Plan:
        gpu_budget, host_budget = detect_budgets(str(self.device))
        return make_plan(self.shape, self.policy, context_tokens, device_is_cuda=self.device.type == "cuda",
                         gpu_budget=self.policy.gpu_memory or gpu_budget,
                         host_budget=self.policy.host_memory or host_budget)

    def allocate(self, batch: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        """Creates every layer's homes; called at the first update (shapes from the model) or before a restore."""
        self.device, self.dtype = torch.device(device), dtype
        capacity = self.policy.max_context or _GROWTH_CAPACITY
        pin = self.policy.pin_memory if self.policy.pin_memory is not None else self.device.type == "cuda"
        g, num_kv_heads = self.plan.head_group_size, self.shape.num_kv_heads
        bounds = [(s, min(s + g, num_kv_heads)) for s in range(0, num_kv_heads, g)]
        num_slots = len(self.layers) * len(bounds)
        resident = _spread(min(self.plan.resident_slots, num_slots), num_slots)
        for layer in self.layers:
            groups = [HeadGroup(s, e, (layer.layer_idx * len(bounds) + i) in resident) for i, (s, e) in enumerate(bounds)]
            layer.store = LayerStore(groups, batch, head_dim, capacity, self.dtype, self.device, pin)
            layer.is_initialized = True
        self.transfer = Transfer(self.device, self.policy.overlap, capacity)
        self._offloaded_order = [(layer.layer_idx, i) for layer in self.layers
                                 for i, home in enumerate(layer.store.homes) if not home.group.is_resident]
        logger.info("HeadInferCache: %d layers x %d groups of %d KV heads, %d resident slots, capacity %d tokens, %s",
                    len(self.layers), len(bounds), g, len(resident), capacity, self.device)

    def reserve(self, num_tokens: int) -> None:
        """Grows every home to hold ``num_tokens`` (they share one capacity), keeping what they hold."""
        self.transfer.synchronize()
        for layer in self.layers:
            for home in layer.store.homes:
                home.reserve(num_tokens, layer.length)

    def check_attention(self, layer_idx: int) -> None:
        impl = getattr(self.config, "_attn_implementation", None)
        if impl is not None and impl != attention.ATTENTION_NAME:
            raise ValueError(
                f"HeadInferCache needs the model loaded with attn_implementation='headinfer' (it has {impl!r}); "
                "`import engine` registers it"
            )
        if layer_idx == 0:
            self.transfer.forget_pending()  # a new forward: nothing may be left from an interrupted one

    # -- the overlap schedule's look-ahead -------------------------------------------------------
    def prefetch_after(self, layer_idx: int, group_idx: int, past: int, q_len: int) -> None:
        """Starts fetching the offloaded slot that follows (layer_idx, group_idx) in this forward."""
        position = bisect.bisect_right(self._offloaded_order, (layer_idx, group_idx))
        if position >= len(self._offloaded_order):
            return  # the forward's last offloaded slot: the next forward starts with a new length
        next_layer, next_group = self._offloaded_order[position]
        layer = self.layers[next_layer]
        start = attention.visible_start(past, layer.window)
        self.transfer.prefetch((next_layer, next_group), layer.store.homes[next_group], start, past,
                               past - start + q_len)

    # -- bookkeeping -----------------------------------------------------------------------------
    def crop_to(self, num_tokens: int) -> None:
        """Keeps the first ``num_tokens`` tokens (e.g. drop a conversation, keep the document)."""
        if not 0 <= num_tokens <= self.get_seq_length():
            raise ValueError(f"cannot crop a cache of {self.get_seq_length()} tokens to {num_tokens}")
        if self.transfer is not None:
            self.transfer.synchronize()
            self.transfer.forget_pending()
        for layer in self.layers:
            layer.length = num_tokens

    def synchronize(self) -> None:
        """Waits for all copies in flight (host homes are complete afterwards)."""
        if self.transfer is not None:
            self.transfer.synchronize()

    def release(self) -> None:
        """Frees every home and buffer; the cache is empty and re-allocates on the next update."""
        if self.transfer is not None:
            self.transfer.free_buffers()
        for layer in self.layers:
            layer.store, layer.length, layer.is_initialized = None, 0, False
        self.transfer = None

    def kv_bytes(self) -> dict[str, int]:
        """Bytes held: ``device`` (resident homes + ping-pong buffers) and ``host`` (offloaded homes)."""
        stores = [layer.store for layer in self.layers if layer.store is not None]
        on_device = sum(s.nbytes(on_device=True) for s in stores)
        buffers = self.transfer.buffer_bytes if self.transfer else 0
        return {"device": on_device + buffers, "host": sum(s.nbytes(on_device=False) for s in stores)}


def _spread(count: int, total: int) -> set[int]:
    """``count`` slot indices spread evenly over ``total``, so resident slots interleave with transfers."""
    return {i * total // count for i in range(count)} if count else set()


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _config_dtype(config) -> torch.dtype:
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32
