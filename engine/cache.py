"""``HeadInferCache``: a transformers ``Cache`` whose layers keep K/V per (layer, head group) homes.

Use it with a model loaded with ``attn_implementation="headinfer"``::

    cache = HeadInferCache(model.config, chunk_size=4096)  # or plan=: a plan made against this machine
    model.generate(ids, past_key_values=cache, prefill_chunk_size=4096)  # transformers >= 5.24: cache=cache

``update`` hands a chunk's K/V back and publishes the layer on the KV route (``kv/route.py``); the registered
attention function takes the route back and calls ``attend``, where the cache's schedule (``kv/schedule.py``)
appends the chunk and attends head group by head group.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import logging
import weakref

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer, LinearAttentionLayer

from .attention import ATTENTION_NAME
from .errors import InputError, StateError
from .kv import HeadGroup, HostAttention, HostMemory, LayerHomes, Schedule, Transfer, kernels, native, route
from .kv import streams as kv_streams
from .kv import visible_start
from .kv.disk import DiskMemory
from .kv.ledger import Ledger
from .kv.probe import QueryProbe
from .planning.allocations import home_capacity, layer_offsets, scratch_elements, slot_placement
from .planning.host_split import choose_host_slots
from .planning.planner import make_plan
from .planning.plan import Plan
from .planning.shape import ModelShape
from .planning.policy import OffloadPolicy
from .planning.shape import unsupported_layers

logger = logging.getLogger(__name__)

_GROWTH_CAPACITY = 4096  # tokens allocated up front when no max_context was planned


class HeadInferLayer(CacheLayerMixin):
    """One attention layer's view of the cache: its length, its window and its homes.

    ``layer_idx`` is the model's index of the layer; ``kv_index`` its place among the layers with K/V (the same
    unless the model is hybrid), which indexes the schedule, the transfers and the plan's slots.
    """

    is_croppable = True

    def __init__(self, cache: "HeadInferCache", layer_idx: int, window: int | None, kv_index: int | None = None):
        super().__init__()
        # Weak: the cache holds its layers, so a strong reference back would make a dropped cache cyclic garbage,
        # its device buffers held until the next cyclic GC pass instead of freed when the last reference goes.
        self._cache = weakref.ref(cache)
        self.layer_idx = layer_idx
        self.kv_index = layer_idx if kv_index is None else kv_index
        self.window = window
        self.is_sliding = window is not None
        self.homes: LayerHomes | None = None
        self.length = 0
        self.consumers: tuple[int, ...] = ()  # layers that attend this layer's K/V as their own (KV sharing)
        self._staged: torch.Tensor | None = None  # this chunk in home layout ([G, Q, B, 2, g, D]), update to attend
        self._decode_homes: LayerHomes | None = None  # the homes decode_row last looked at, and their home it
        self._decode_home = None  # writes in place (None: none)

    @property
    def cache(self) -> "HeadInferCache":
        cache = self._cache()
        if cache is None:
            raise StateError("this cache layer's HeadInferCache was dropped")
        return cache

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, _, _, head_dim = key_states.shape
        self.cache.allocate(batch, head_dim, key_states.dtype, key_states.device)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Appends this chunk's K/V ([B, KVH, Q, D], compute device) and hands it back for ``attend``."""
        if not self.is_initialized or self.homes is None:
            self.lazy_initialization(key_states, value_states)
        self.cache.begin_layer(self.kv_index)
        keys, values = key_states.contiguous(), value_states.contiguous()
        q_len = keys.shape[2]
        if not self.homes.has_room(self.length, q_len):
            self.cache.reserve(self.length + q_len, q_len)
        self._staged = self.cache.schedule.append(self.kv_index, self.length, keys, values)
        self.length += q_len
        route.publish(self.layer_idx, self, keys)
        for consumer in self.consumers:  # they receive these very key states (transformers' shared_kv_states)
            route.publish(consumer, SharedKV(self), keys)
        return keys, values

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scaling: float,
               window: int | None, softcap: float | None) -> torch.Tensor:
        """query: [B, H, Q, D]; key/value: this chunk as returned by ``update``. Returns [B, Q, H, D]."""
        past = self.length - key.shape[2]
        staged, self._staged = self._staged, None
        return self.cache.schedule.attend(self.kv_index, past, query, staged, scaling=scaling,
                                          window=window, softcap=softcap)

    def attend_shared(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scaling: float,
                      window: int | None, softcap: float | None) -> torch.Tensor:
        """A consumer layer's queries ([B, H, q, D]: the chunk's last q, as Gemma 4 drops the others before its
        shared layers) over this layer's past and chunk (key/value: the chunk ``update`` returned). The chunk's
        first tokens are in the homes already; its last q are staged again, as the producer's staging buffer may
        have been reused since. Returns [B, q, H, D]."""
        q_len = query.shape[2]
        tail = key.shape[2] - q_len
        _, staged = self.cache.transfer.stage(key[:, :, tail:], value[:, :, tail:], self.kv_index)
        return self.cache.schedule.attend(self.kv_index, self.length - q_len, query, staged, scaling=scaling,
                                          window=window, softcap=softcap, record=False)

    # -- the fused CPU decode step's path (engine/cpu/fused_decode.py) --------------------------------------
    def decode_row(self) -> torch.Tensor | None:
        """Where a one-token CPU decode step writes its K/V itself: the row of token ``length`` in this layer's one
        home, ``[B, 2, KVH, D]`` fp32 (then ``attend_decoded``); None where ``update``/``attend`` must run (a home
        that is offloaded, 8-bit, a window ring, on disk or full; several groups; streams other than synchronous,
        whose declared reads and writes a checker follows; no C kernel for its head dim).

        Why: the generic path's torch and Python calls a layer (stage, copy home, walk the runs) are slow right after
        the GEMVs streamed the weights through every cache (docs/benchmarks/decode-ops.md, Notes from the code)."""
        homes = self.homes
        if homes is None:
            return None
        if homes is not self._decode_homes:  # (re)allocated: whether they qualify, decided once
            self._decode_homes, self._decode_home = homes, self._plain_home(homes)
        home = self._decode_home
        if home is None or not homes.has_room(self.length, 1):
            return None  # (full: update grows the homes, and the next step is in place again)
        if self.kv_index == 0:
            self.cache.begin_layer(0)  # (what it checks on the other layers is the config's, checked here)
        return home.kv[self.length]

    def _plain_home(self, homes: LayerHomes):
        """The layer's one home if ``decode_row`` may write and read it in place, else None."""
        if len(homes) != 1:
            return None
        home = homes.homes[0]
        kv = home.kv
        if (home.is_host or home.is_quantized or home.is_ring or home.group.is_on_disk or kv.device.type != "cpu"
                or kv.dtype != torch.float32 or type(self.cache.transfer.streams) is not kv_streams.SyncStreams
                or kv.shape[-1] not in native.HEAD_DIMS or native.kernel() is None):
            return None
        return home

    def attend_decoded(self, query: torch.Tensor, *, scaling: float, window: int | None) -> torch.Tensor:
        """After the step wrote its token's K/V into ``decode_row()``: counts the token and attends its queries
        ([B, H, 1, D]) over the home's visible tokens in place, as ``attend`` does a resident home's (the probe
        recording them too). Returns [B, H, 1, D]."""
        past = self.length
        self.length += 1
        schedule = self.cache.schedule
        if schedule.probe is not None:
            schedule.probe.record(self.kv_index, past, query, scaling)
        start = visible_start(past, window)
        block = self._decode_home.kv[start : past + 1]  # [tokens, B, 2, g, D], the visible ones
        return kernels.attend_span(query, block, q_offset=past - start, scaling=scaling, window=window)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise InputError("crop takes a negative number of tokens to remove; use HeadInferCache.crop_to(length)")
        self.cache.settle()
        target = max(0, self.length + tokens_to_remove)
        if self.homes is not None:
            self.homes.crop_to(target, self.length)
        self.length = target

    def reset(self) -> None:
        self.cache.settle()
        if self.homes is not None:
            self.homes.crop_to(0, self.length)  # rows a saved snapshot links move out of the way first
        self.length = 0

    def offload(self) -> None:  # the schedule moves data itself
        pass

    def prefetch(self) -> None:
        pass

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise InputError("HeadInferCache does not support beam search; use greedy or sampling")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise InputError("HeadInferCache does not support expanding the batch (num_return_sequences / beams)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise InputError("HeadInferCache does not support selecting batch rows")


class SharedKV:
    """What the KV route hands a consumer layer (KV sharing): its producer's K/V, attended with its own queries."""

    def __init__(self, producer: HeadInferLayer):
        self.producer = producer

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scaling: float,
               window: int | None, softcap: float | None) -> torch.Tensor:
        return self.producer.attend_shared(query, key, value, scaling=scaling, window=window, softcap=softcap)


class HeadInferCache(Cache):
    """Exact KV cache kept per (layer, KV head group), mostly in host memory.

    Args:
        config: the model config (``model.config``).
        policy: an ``OffloadPolicy``; keyword arguments override its fields (``chunk_size=...``).
        plan: the placement to allocate (``make_plan`` against a ``MachineBudget``, as ``DocumentSession`` does);
            without one the cache plans from the config and the policy alone: budgets are only the policy's
            ``gpu_memory`` / ``host_memory``. The constructor reads the config and nothing else: no probing,
            benchmarking or file I/O (as transformers' caches and gpt-fast's setup).
        device / dtype: where and in what the model computes; default: CUDA if available, the config dtype.
    """

    def __init__(self, config, policy: OffloadPolicy | None = None, *, plan: Plan | None = None,
                 device: str | torch.device | None = None, dtype: torch.dtype | None = None, **policy_overrides):
        self.config = config
        text_config = config.get_text_config(decoder=True)
        self.policy = dataclasses.replace(policy or OffloadPolicy(), **policy_overrides)
        self.device = torch.device(device) if device is not None else _default_device()
        self.dtype = dtype or _config_dtype(text_config)
        self.shape = ModelShape.from_config(text_config, dtype_bytes=torch.tensor([], dtype=self.dtype).element_size())
        if (reason := unsupported_layers(text_config)) is not None:
            raise InputError(f"HeadInferCache cannot serve this model exactly: {reason}")
        self.policy.validate_for(self.shape.kv_heads)
        #: The layers with K/V, in order; a hybrid model's other layers keep their fixed-size state on the compute
        #: device in transformers' own ``LinearAttentionLayer`` (no homes, no fetches), and a KV-sharing model's
        #: consumer layers keep nothing (transformers' ``DummyLayer``): they attend their producer's homes.
        self.kv_layers = [HeadInferLayer(self, i, w, k) for k, (i, w)
                          in enumerate(zip(self.shape.kv_layer_indices, self.shape.sliding_windows))]
        by_index = {layer.layer_idx: layer for layer in self.kv_layers}
        for consumer, producer in self.shape.shared_layers:
            by_index[producer].consumers += (consumer,)
        self._num_states = int(getattr(text_config, "number_of_conv_states", 1))
        super().__init__(layers=self._all_layers())
        self._state_anchor: tuple[int, dict[int, LinearAttentionLayer]] | None = None  # (tokens, states then)
        self.transfer: Transfer | None = None
        self.schedule: Schedule | None = None
        self._probe: QueryProbe | None = None  # ``record_queries``'s, kept across a re-allocation
        self._host: HostMemory | None = None
        self._disk: DiskMemory | None = None
        self.ledger = Ledger()  # every buffer this cache allocates, by category and device (``kv/ledger.py``)
        self.plan: Plan = plan or make_plan(
            self.shape, self.policy, self.policy.max_context or getattr(text_config, "max_position_embeddings", 8192),
            device_is_cuda=self.device.type == "cuda")
        if plan is not None and (plan.chunk_size, plan.device_is_cuda) != (self.policy.chunk_size,
                                                                             self.device.type == "cuda"):
            raise InputError(f"the plan (chunk {plan.chunk_size}, CUDA {plan.device_is_cuda}) was made for another "
                             f"policy or device (chunk {self.policy.chunk_size}, {self.device})")
        if self.policy.max_context is not None:
            # Refuse a context the machine cannot hold before a single byte is allocated.
            self.plan.require_fit()

    def _all_layers(self, states: dict[int, LinearAttentionLayer] | None = None) -> list:
        """Every decoder layer's cache object in model order: ``kv_layers`` and (hybrids) fresh or given states."""
        if states is None:
            states = {i: LinearAttentionLayer(number_of_states=self._num_states) for i in self.shape.state_layers}
        shared = {consumer: DummyLayer() for consumer, _ in self.shape.shared_layers}
        by_index = {layer.layer_idx: layer for layer in self.kv_layers} | states | shared
        return [by_index[i] for i in range(len(by_index))]

    # -- allocation ------------------------------------------------------------------------------
    def allocate(self, batch: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        """Creates every layer's homes; called at the first update (shapes from the model) or before a restore."""
        try:
            self._allocate(batch, head_dim, dtype, device)
        except BaseException:
            self.release()  # all or nothing: a refused page-lock or a full disk leaves no half-made cache
            raise

    def _allocate(self, batch: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.device, self.dtype = torch.device(device), dtype
        capacity = self.policy.max_context or _GROWTH_CAPACITY
        is_cuda = self.device.type == "cuda"
        streams = kv_streams.make(self.policy.streams, self.device)
        # Page-locked homes only where copies are asynchronous DMA (not on emulated streams: plain memory there).
        pin = (self.policy.pin_memory if self.policy.pin_memory is not None else is_cuda) and is_cuda
        g = self.plan.head_group_size
        groups_per_layer = self.shape.groups_per_layer(g)
        offsets = layer_offsets(groups_per_layer)
        num_slots = sum(groups_per_layer)
        resident, on_disk = slot_placement(num_slots, self.plan.resident_slots, self.plan.disk_slots, cuda=is_cuda,
                                           quantized=self.policy.kv_dtype is not None)
        self._disk = DiskMemory(self.policy.disk_dir) if on_disk else None
        any_offloaded = len(resident) < num_slots
        chunk = self.policy.chunk_size
        # A fetch holds a group's visible past plus one chunk: a sliding layer never needs more than its window.
        visible = max(home_capacity(w, capacity, chunk) for w in self.shape.sliding_windows)
        # Each ping-pong buffer holds the plan's number of groups' worth, so a run of that many is one fetch even
        # at the planned context (batch 1 only: larger batches fetch one group at a time, ``Schedule.units``).
        per_buffer = self.plan.groups_per_buffer if batch == 1 else 1
        # (layers that differ in KV shape: the buffers are the largest layer's, seen per layer's shape)
        layer_shapes = () if self.shape.is_uniform else tuple(zip(groups_per_layer, self.shape.head_dims))
        self.transfer = Transfer(self.device, num_layers=len(self.kv_layers), num_groups=max(groups_per_layer),
                                 group_shape=(batch, g, max(head_dim, self.shape.head_dim)), dtype=dtype,
                                 layer_shapes=layer_shapes,
                                 buffer_tokens=visible * per_buffer if any_offloaded else 1, stage_tokens=chunk,
                                 kv_dtype=self.policy.kv_dtype, disk=self._disk, streams=streams,
                                 ledger=self.ledger,
                                 scratch_elements=scratch_elements(self.shape, capacity=capacity, chunk=chunk, group=g,
                                                                   cuda=is_cuda, batch=batch,
                                                                   dtype_bytes=dtype.itemsize,
                                                                   groups_per_buffer=per_buffer))
        self._host = HostMemory(pin, self.transfer.fence, ledger=self.ledger, budget=streams.pin_budget)
        for layer in self.kv_layers:
            slots = [offsets[layer.kv_index] + i for i in range(groups_per_layer[layer.kv_index])]
            groups = [HeadGroup(i * g, (i + 1) * g, slot in resident, slot in on_disk) for i, slot in enumerate(slots)]
            layer_dim = head_dim if self.shape.is_uniform else self.shape.head_dims[layer.kv_index]
            layer.homes = LayerHomes(groups, batch, layer_dim, capacity, dtype, self.device, self._host,
                                     window=layer.window, chunk=chunk, kv_dtype=self.policy.kv_dtype, disk=self._disk)
            layer.is_initialized = True
        host_slots = self._host_slots(groups_per_layer, resident)
        self.schedule = Schedule([layer.homes for layer in self.kv_layers], list(self.shape.sliding_windows),
                                 self.transfer, self.policy.overlap,
                                 HostAttention(streams=streams) if host_slots else None,
                                 host_slots, disk=self._disk)
        self.schedule.probe = self._probe
        logger.info("HeadInferCache: %d layers x %s groups of %d KV heads, %d resident slots, %d on disk, %d attended "
                    "on the host in decode, capacity %d tokens, %d group(s) per fetch buffer, %s", len(self.kv_layers),
                    "/".join(map(str, sorted(set(groups_per_layer)))), g, len(resident), len(on_disk), len(host_slots), capacity, per_buffer, self.device)
        if self.plan.decode_seconds is not None:  # a plan made with the machine's rates: the split and its forecast
            logger.info("HeadInferCache %s", self.plan.decode_line())

    def _host_slots(self, groups_per_layer: tuple[int, ...], resident: set[int]) -> frozenset[tuple[int, int]]:
        """The offloaded slots decode steps attend on the host: the plan's share of their bytes, spread evenly."""
        context = self.plan.context_tokens
        offsets = layer_offsets(groups_per_layer)
        slots = [(layer, group) for layer in range(len(self.kv_layers)) for group in range(groups_per_layer[layer])
                 if offsets[layer] + group not in resident]
        dims = self.shape.head_dims
        weights = [(context if (w := self.shape.sliding_windows[layer]) is None else min(w, context)) * dims[layer]
                   for layer, _ in slots]
        return choose_host_slots(slots, weights, self.plan.host_share)

    def reserve(self, num_tokens: int, chunk: int = 0) -> None:
        """Grows every home to hold ``num_tokens`` (window rings: a ``chunk``-token append), keeping what they hold."""
        self.transfer.synchronize()
        for layer in self.kv_layers:
            layer.homes.reserve(num_tokens, layer.length, max(chunk, self.policy.chunk_size),
                                fixed_device=self.policy.max_context is not None)

    def begin_layer(self, layer_idx: int) -> None:
        """Checks the model runs head-wise attention; a forward's first layer also clears what an interrupted one left."""
        impl = getattr(self.config, "_attn_implementation", None)
        if impl is not None and impl != ATTENTION_NAME:
            raise InputError(
                f"HeadInferCache needs the model loaded with attn_implementation='headinfer' (it has {impl!r}); "
                "`import engine` registers it"
            )
        if layer_idx == 0:
            route.clear()
            self.transfer.release_all()
            lengths = {layer.length for layer in self.kv_layers}
            if len(lengths) > 1:
                # A forward interrupted part-way (an exception, a cancel) left some layers a chunk ahead.
                raise StateError(f"the cache's layers hold different lengths {sorted(lengths)}: crop it to "
                                 f"{min(lengths)} tokens (crop_to) after an interrupted forward")

    # -- bookkeeping -----------------------------------------------------------------------------
    def crop_to(self, num_tokens: int) -> None:
        """Keeps the first ``num_tokens`` tokens (e.g. drop a conversation, keep the document)."""
        if not 0 <= num_tokens <= self.get_seq_length():
            raise InputError(f"cannot crop a cache of {self.get_seq_length()} tokens to {num_tokens}")
        if self.restorable_length(num_tokens) != num_tokens:
            raise InputError(f"cannot crop back to {num_tokens} tokens: this hybrid model's linear-attention or "
                             "convolution layers keep only their latest state, which can only go back to its anchor "
                             f"({self._state_anchor[0] if self._state_anchor else 0} tokens) or to 0")
        for layer in self.kv_layers:
            if layer.homes is not None and not layer.homes.can_crop_to(num_tokens, layer.length):
                raise InputError(f"cannot crop back to {num_tokens} tokens: sliding-window layers keep only their "
                                 "window plus a chunk (anchor the document end with HeadInferCache.anchor)")
        self.settle()
        for layer in self.kv_layers:
            if layer.homes is not None:
                layer.homes.crop_to(num_tokens, layer.length)
            layer.length = num_tokens
        if self.shape.state_layers:
            self._restore_states(num_tokens)

    def restorable_length(self, num_tokens: int, *, states_advanced: bool = False) -> int:
        """The longest prefix of at most ``num_tokens`` tokens that ``crop_to`` returns to exactly.

        Any prefix, unless the model is hybrid: a fixed-size state holds no past, so it stays where it is (not
        after a forward that raised part-way: ``states_advanced``), goes back to the anchor's copy, or starts over.
        """
        length = self.get_seq_length()
        if not self.shape.state_layers or (num_tokens >= length and not states_advanced):
            return min(num_tokens, length)
        anchored = self._state_anchor[0] if self._state_anchor is not None else 0
        return anchored if anchored <= num_tokens else 0

    def _restore_states(self, num_tokens: int) -> None:
        if self._state_anchor is not None and self._state_anchor[0] == num_tokens:
            # A copy of the anchor's states: it serves every later crop back here. Restored even when nothing was
            # appended since, since a forward that raised part-way may have advanced some states.
            states = {i: copy.deepcopy(layer) for i, layer in self._state_anchor[1].items()}
            self.layers = self._all_layers(states)
        elif num_tokens == 0:
            self.layers = self._all_layers()
    def anchor(self, num_tokens: int | None = None) -> None:
        """Keeps the sliding windows before ``num_tokens`` (default: now) so ``crop_to`` can return there later,
        however much is appended meanwhile (e.g. the end of the document, before conversations)."""
        num_tokens = self.get_seq_length() if num_tokens is None else num_tokens
        if self.shape.state_layers:
            if num_tokens != self.get_seq_length():
                raise InputError(f"a hybrid model's cache can only be anchored where it is ({self.get_seq_length()} "
                                 f"tokens, not {num_tokens}): its fixed-size states hold no past")
            self._state_anchor = (num_tokens, {i: copy.deepcopy(self.layers[i]) for i in self.shape.state_layers})
        if all(layer.window is None for layer in self.kv_layers):
            return  # no rings: every token stays, nothing to keep (and the prefetch in flight stays valid)
        self.synchronize()  # host homes are complete only once the appends have landed
        for layer in self.kv_layers:
            if layer.homes is not None:
                layer.homes.set_anchor(num_tokens)

    @property
    def disk_tier(self) -> DiskMemory | None:
        """The disk tier's files, when the plan put homes there (snapshots link them)."""
        return self._disk

    def settle(self) -> None:
        """Waits for copies in flight and drops prefetches: call before tokens are taken away."""
        route.clear()
        if self.transfer is not None:
            self.transfer.synchronize()
            self.transfer.forget()

    def record_queries(self, probe: QueryProbe | None) -> None:
        """Hands every attention step's queries of ``probe``'s heads to ``probe`` from now on (an answer's sources, the
        retrieval-head calibration), or stops recording (``None``)."""
        self._probe = probe
        if self.schedule is not None:
            self.schedule.probe = probe

    def synchronize(self) -> None:
        """Waits for all copies in flight (host homes are complete afterwards)."""
        if self.transfer is not None:
            self.transfer.synchronize()

    def release(self) -> None:
        """Frees every home and buffer; the cache is empty and re-allocates on the next update."""
        try:
            if self.transfer is not None:
                try:
                    self.transfer.synchronize()  # (raises a failed disk job, after waiting for everything)
                finally:
                    try:
                        for layer in self.kv_layers:  # freed below: the streams seam checks no copy touches them
                            for home in layer.homes or ():
                                for plane in home.planes:
                                    self.transfer.streams.forget(plane)
                    finally:  # (the disk worker must stop before the files it reads are unmapped below)
                        self.transfer.close()
        finally:
            for layer in self.kv_layers:
                layer.homes, layer.length, layer.is_initialized = None, 0, False
            self.layers, self._state_anchor = self._all_layers(), None
            if self._host is not None:
                self._host.free_all()  # unlocks host memory only now that no copy can touch it
            if self._disk is not None:
                self._disk.close()  # unmaps and deletes the disk tier's files
            self.transfer, self.schedule, self._host, self._disk = None, None, None, None

    @property
    def host_attention_seconds(self) -> float:
        """Wall time spent in host attention so far (decode steps; diff it per token for a meter)."""
        return self.schedule.host_seconds if self.schedule is not None else 0.0

    def kv_bytes(self) -> dict[str, int]:
        """Bytes held: ``device`` (resident homes + staging, ping-pong and scratch buffers), ``host`` (homes in RAM) and
        ``disk`` (the disk tier's files)."""
        homes = [layer.homes for layer in self.kv_layers if layer.homes is not None]
        on_device = sum(h.nbytes(on_device=True) for h in homes)
        buffers = self.transfer.buffer_bytes if self.transfer else 0
        return {"device": on_device + buffers, "host": sum(h.nbytes(on_device=False) for h in homes),
                "disk": sum(h.disk_bytes for h in homes)}


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _config_dtype(config) -> torch.dtype:
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def cache_argument(model) -> str:
    """The keyword under which ``model``'s forward takes a ``Cache``: ``"cache"`` from transformers 5.24 on, where
    ``past_key_values`` is deprecated (removed in 5.40), else ``"past_key_values"`` (5.17-5.23 know only that)."""
    return _cache_argument(type(model))


@functools.cache  # per model class: a decode step asks, and reading a signature costs tens of microseconds
def _cache_argument(model_class) -> str:
    try:
        parameters = inspect.signature(model_class.forward).parameters
    except (AttributeError, TypeError, ValueError):  # no introspectable forward: the long-standing name
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"
