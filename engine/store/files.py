"""Writing a snapshot folder atomically from a cache's homes, and reading one back into them.

A snapshot is written under a temporary name in the same directory, every file fsynced, the header
last, then renamed into place: a crash or a full disk part-way leaves only a ``.tmp-*`` folder that no
reader looks at (and that is removed on failure, or by the store later). A restore checks the header
and the file sizes before it touches the cache, then streams each file into the homes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ..errors import ChecksumMismatch, CorruptSnapshotError, InputError, SnapshotError, TruncatedFile
from ..cache import HeadInferCache
from ..kv import LayerHomes
from ..kv.quant import KV_DTYPES, SCALE_DTYPE
from ..paths_windows import is_ntfs_name
from .fingerprint import dtype_name, token_ids_bytes
from .format import (
    HEADER_FILE,
    LAST_USED_FILE,
    PREVIOUS_HEADER_FILE,
    TOKENS_FILE,
    COMPLETE_VERSION,
    FileEntry,
    SnapshotHeader,
    SnapshotIdentity,
    home_file,
    layer_file,
    part_file,
    shape_fields,
)
from .streaming import SpanStreamer, fsync_directory

logger = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"
SIDECAR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def saved_range(window: int | None, num_tokens: int) -> tuple[int, int]:
    """Tokens a layer's file holds: all of them, or for a sliding-window layer the window before the end."""
    return (0 if window is None else max(0, num_tokens - (window - 1)), num_tokens)


Part = tuple[int, int, list[torch.Tensor]]  # (head group, plane, its contiguous spans in token order)


def layer_parts(homes: LayerHomes, num_tokens: int) -> list[Part]:
    """The layer's saved tokens in file order: per group and plane, its [n, B, 2, g, D] tokens as one span (two
    where a window ring wraps)."""
    start, stop = saved_range(homes.window, num_tokens)
    return [(g, plane, home.spans(start, stop, plane)) for g, home in enumerate(homes)
            for plane in range(len(home.planes))]


def snapshot_bytes(cache: HeadInferCache, num_tokens: int) -> tuple[int, int]:
    """(the size a snapshot of the cache's first ``num_tokens`` tokens takes on disk, the part of it that
    disk-tier homes hold and a save links rather than writes), headers aside."""
    total, linked = 4 * num_tokens, 0
    for layer in cache.kv_layers:
        start, stop = saved_range(layer.window, num_tokens)
        for home in layer.homes:
            num_bytes = sum(p[0].nbytes for p in home.planes) * (stop - start)
            total += num_bytes
            linked += num_bytes if home.disk is not None else 0
    return total, linked


def write_snapshot(target: Path, cache: HeadInferCache, identity: SnapshotIdentity, token_ids: list[int], *,
                   label: str = "", policy: dict | None = None,
                   sidecar: tuple[tuple[str, str], ...] = ()) -> SnapshotHeader:
    """Saves the first ``identity.num_tokens`` tokens of ``cache`` as the snapshot folder ``target``.

    ``sidecar``: (file name, text) pairs written beside the K/V (the app's shelf entry), fsynced before the rename
    like every file of the snapshot: a snapshot that appears under its name is complete, its text included.

    Raises ``FileExistsError`` if ``target`` appeared meanwhile (another writer won), ``OSError`` on a
    write failure; either way nothing is left behind but what was there before.
    """
    num_tokens = identity.num_tokens
    _refuse_states(cache)
    if any(layer.homes is None or layer.length < num_tokens for layer in cache.kv_layers):
        raise InputError(f"the cache does not hold the {num_tokens:,} tokens to save")
    home = cache.kv_layers[0].homes[0]
    if dtype_name(home.dtype) != identity.dtype:
        raise InputError(f"the cache holds {home.dtype} K/V but the model runs in {identity.dtype}")
    for name, _ in sidecar:
        check_sidecar_name(name)
    cache.synchronize()  # host homes are complete only once the asynchronous appends have landed
    scratch = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{target.name}-", dir=target.parent))
    try:
        parts = [(layer, layer_parts(layer.homes, num_tokens)) for layer in cache.kv_layers]
        with _streamer(cache, [(layer.homes, p) for layer, p in parts]) as streamer:
            ids = torch.frombuffer(bytearray(token_ids_bytes(token_ids)), dtype=torch.uint8)
            files = [FileEntry(TOKENS_FILE, *streamer.write_file(scratch / TOKENS_FILE, [ids]))]
            linked = []  # (plane, file name) of the disk-tier homes linked into the snapshot
            for layer, layer_spans in parts:
                in_layer_file = []
                for group_idx, plane, spans in layer_spans:
                    home = layer.homes[group_idx]
                    if home.disk is None:  # in RAM, on the device, or a ring: its tokens go into the layer file
                        in_layer_file += spans
                        continue
                    name = home_file(layer.layer_idx, group_idx, plane)
                    where = {"layer": layer.layer_idx, "group": group_idx, "plane": plane}
                    tensor = home.planes[plane]
                    if home.disk.link(tensor, scratch / name):  # the home file is the span: no byte is copied
                        crc = home.disk.prefix_crc(tensor, num_tokens)
                        files.append(FileEntry(name, spans[0].nbytes, crc, **where))
                        linked.append((home.disk, tensor, name))
                    else:  # another filesystem: a copy of the prefix, in the same place of the format
                        files.append(FileEntry(name, *streamer.write_file(scratch / name, spans), **where))
                name = layer_file(layer.layer_idx)
                files.append(FileEntry(name, *streamer.write_file(scratch / name, in_layer_file)))
        header = SnapshotHeader(identity, label, time.time(), files=tuple(files), policy=policy or {},
                                kv_dtype=cache.policy.kv_dtype, **shape_fields(cache, COMPLETE_VERSION))
        for name, text in sidecar:
            _write_durably(scratch / name, text.encode("utf-8"))
        _write_durably(scratch / HEADER_FILE, header.to_json().encode())
        _write_durably(scratch / LAST_USED_FILE, b"")
        fsync_directory(scratch)
        try:
            os.rename(scratch, target)  # atomic; refuses a non-empty target instead of mixing two snapshots
        except OSError as error:
            if target.exists():
                raise FileExistsError(f"{target} was written by another process meanwhile") from error
            raise
        fsync_directory(target.parent)
        for disk, tensor, name in linked:  # from now on rows [0, num_tokens) of those files are the snapshot's
            disk.seal(tensor, num_tokens, target / name)
        return header
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # no-op after a successful rename


def read_snapshot(folder: Path, header: SnapshotHeader, cache: HeadInferCache) -> int:
    """Streams the snapshot in ``folder`` into ``cache`` (already checked with ``check_compatible``).

    Returns the bytes read. On ``CorruptSnapshotError`` (truncated or altered files) the cache is left
    empty. Homes are allocated here when the cache has none yet, on the cache's device.
    """
    for entry in header.files:
        size = _size(folder / entry.name)
        if size < entry.num_bytes or (size > entry.num_bytes and not entry.is_home):
            what = "truncated" if size < entry.num_bytes else "longer than its header says"
            raise CorruptSnapshotError(f"{entry.name} is {what} ({size:,} of {entry.num_bytes:,} bytes)")
    _check_sizes(header, cache)  # before any allocation: the header's shape is what its files hold
    if header.num_read is not None:
        return _read_partial(folder, header, cache)
    num_tokens = header.identity.num_tokens
    _prepare(cache, header)
    entries = {f.name: f for f in header.files}
    home_files = {(f.layer, f.group, f.plane): f for f in header.files if f.is_home}
    with _damaged("the snapshot"):
        per_layer = [_restore_parts(layer.homes, header, heads, dim, num_tokens)
                     for layer, (_, heads, dim) in zip(cache.kv_layers, header.layer_shapes)]
        with _streamer(cache, [(layer.homes, parts) for layer, (parts, _) in zip(cache.kv_layers, per_layer)]) as streamer:
            streamer.prefault([span for parts, _ in per_layer for _, _, spans in parts for span in spans])
            total = _read_tokens(streamer, folder, header, entries)
            for layer, (parts, regroup) in zip(cache.kv_layers, per_layer):
                name = layer_file(layer.layer_idx)
                own = [(home_files.get((layer.layer_idx, g, plane)), spans) for g, plane, spans in parts]
                total += streamer.read_file(folder / name, [r for entry, spans in own if entry is None for r in spans],
                                            entries[name].crc32)
                for entry, spans in own:
                    if entry is not None:
                        total += streamer.read_file(folder / entry.name, spans, entry.crc32, whole=False)
                regroup()
    for layer in cache.kv_layers:
        layer.length = num_tokens
    return total


def _check_sizes(header: SnapshotHeader, cache: HeadInferCache) -> None:
    """Raises ``CorruptSnapshotError`` unless each layer's files (a partial read's: each part) hold exactly its
    saved tokens at the header's batch, heads, head dim and dtype: a header whose batch or shape does not multiply
    out to its files would otherwise size the cache's homes (a batch of a million: a MemoryError in the handler)."""
    dtype = getattr(torch, header.identity.dtype, None)
    if not isinstance(dtype, torch.dtype) or (header.kv_dtype is not None and header.kv_dtype not in KV_DTYPES):
        raise CorruptSnapshotError(f"unknown dtype {header.identity.dtype!r} / {header.kv_dtype!r} in the header")
    def per_token(heads: int, dim: int) -> int:
        if header.kv_dtype is None:
            per_head = dim * dtype.itemsize
        else:
            per_head = dim * KV_DTYPES[header.kv_dtype][0].itemsize + SCALE_DTYPE.itemsize
        return header.batch * 2 * heads * per_head

    layer_bytes = {i: per_token(heads, dim) for i, heads, dim in header.layer_shapes}  # a token's, by model index
    num_tokens = header.identity.num_tokens
    by_name = {f.name: f for f in header.files}
    wrong = by_name[TOKENS_FILE].num_bytes != 4 * num_tokens if TOKENS_FILE in by_name else True
    if header.num_read is not None:
        wrong = wrong or any(f.layer not in layer_bytes or f.num_bytes != (f.stop - f.start) * layer_bytes[f.layer]
                             for f in header.files if f.is_part)
    else:
        for layer in cache.kv_layers:
            start, stop = saved_range(layer.window, num_tokens)
            held = sum(f.num_bytes for f in header.files
                       if f.name == layer_file(layer.layer_idx) or (f.is_home and f.layer == layer.layer_idx))
            wrong = wrong or held != (stop - start) * layer_bytes.get(layer.layer_idx, -1)
    if wrong:
        raise CorruptSnapshotError("the snapshot's header gives sizes its shape does not multiply out to "
                                   f"(batch {header.batch}, {header.num_kv_heads} KV heads x {header.head_dim})")


def _read_partial(folder: Path, header: SnapshotHeader, cache: HeadInferCache) -> int:
    """``read_snapshot`` of a partial read (``checkpoint.py``): each layer's part files, in token order, into its
    homes; the cache then holds the document's first ``header.num_read`` tokens."""
    num_read = header.num_read
    parts: dict[int, list[FileEntry]] = {}
    for entry in header.files:
        if entry.is_part:
            parts.setdefault(entry.layer, []).append(entry)
    _prepare(cache, header)
    if any(home.group.size != header.head_group_size for layer in cache.kv_layers for home in layer.homes):
        raise SnapshotError(f"this partial read was saved with head groups of {header.head_group_size}: "
                            "continue it with the same, or read the document again")
    plan = []  # (part, its spans in file order)
    for layer in cache.kv_layers:
        layer_parts_ = sorted(parts.get(layer.layer_idx, []), key=lambda f: f.start)
        wanted = [saved_range(layer.window, num_read)] if layer.window is not None else None
        covered = [(f.start, f.stop) for f in layer_parts_]
        chain = covered and covered[0][0] == 0 and covered[-1][1] == num_read and all(
            a[1] == b[0] for a, b in zip(covered, covered[1:]))
        if (covered != wanted) if wanted is not None else not chain:
            raise CorruptSnapshotError(f"layer {layer.layer_idx}'s parts do not hold its tokens before {num_read:,}")
        for part in layer_parts_:
            plan.append((part, layer.homes, [(g, plane, home.spans(part.start, part.stop, plane))
                                             for g, home in enumerate(layer.homes) for plane in range(len(home.planes))]))
    entries = {f.name: f for f in header.files}
    with _damaged("the partial read"):
        with _streamer(cache, [(homes, groups) for _, homes, groups in plan]) as streamer:
            total = _read_tokens(streamer, folder, header, entries)
            for part, _, groups in plan:
                assert part.name == part_file(part.layer, part.start, part.stop)
                total += streamer.read_file(folder / part.name, [r for _, _, spans in groups for r in spans],
                                            part.crc32)
    for layer in cache.kv_layers:
        layer.length = num_read
    return total


def _read_tokens(streamer: SpanStreamer, folder: Path, header: SnapshotHeader, entries: dict[str, FileEntry]) -> int:
    """Reads the token ids file and checks it against the header's hash; returns the bytes read."""
    ids = torch.empty(entries[TOKENS_FILE].num_bytes, dtype=torch.uint8)
    total = streamer.read_file(folder / TOKENS_FILE, [ids], entries[TOKENS_FILE].crc32)
    if hashlib.sha256(ids.numpy()).hexdigest() != header.identity.token_ids_sha256:
        raise ChecksumMismatch(f"{TOKENS_FILE} holds other token ids than the header says")
    return total


@contextmanager
def _damaged(what: str) -> Iterator[None]:
    """A truncated, altered or missing file while reading ``what`` becomes a ``CorruptSnapshotError``."""
    try:
        yield
    except (TruncatedFile, ChecksumMismatch) as error:
        raise CorruptSnapshotError(f"{error}: {what} is damaged") from error
    except FileNotFoundError as error:
        raise CorruptSnapshotError(f"a snapshot file is missing ({error.filename})") from error


def _prepare(cache: HeadInferCache, header: SnapshotHeader) -> None:
    """Empties the cache and makes sure its homes match the snapshot (dtype, batch, head_dim, capacity)."""
    _refuse_states(cache)
    if header.kv_dtype != cache.policy.kv_dtype:
        stored = lambda kind: kind or "the model's dtype"  # noqa: E731
        raise SnapshotError(f"the snapshot holds K/V in {stored(header.kv_dtype)}, this session keeps "
                            f"{stored(cache.policy.kv_dtype)}: read the document again")
    dtype = getattr(torch, header.identity.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptSnapshotError(f"unknown dtype {header.identity.dtype!r} in the header")
    homes = cache.kv_layers[0].homes
    if homes is not None:
        held = (homes[0].dtype, homes[0].kv.shape[1], tuple(layer.homes[0].kv.shape[4] for layer in cache.kv_layers))
        if held != (dtype, header.batch, tuple(dim for _, _, dim in header.layer_shapes)):
            cache.release()
    if cache.kv_layers[0].homes is None:
        cache.allocate(header.batch, header.head_dim, dtype, cache.device)
    else:
        cache.crop_to(0)  # waits for copies in flight and drops stale prefetches
    cache.reserve(header.identity.num_tokens)
    for layer in cache.kv_layers:  # disk homes are read into behind their running checksums' back
        for home in layer.homes:
            for plane in home.planes if home.disk is not None else ():
                home.disk.forget_written(plane, 0)


def _streamer(cache: HeadInferCache, parts: list[tuple[LayerHomes, list[Part]]]) -> SpanStreamer:
    """A streamer on the cache's streams seam. With asynchronous streams on a CPU (emulated), the spans of resident
    homes take the staged path a GPU's would, so the checker sees its copies and waits."""
    streams = cache.transfer.streams if cache.transfer is not None else None
    device = frozenset()
    if streams is not None and streams.is_async:
        def resident(homes: LayerHomes, g: int, plane: int, span: torch.Tensor) -> bool:
            # (a span read into a scratch tensor for regrouping is host memory whatever its group)
            home = homes[g] if g < len(homes) else None
            return (home is not None and not home.is_host and plane < len(home.planes)
                    and span.untyped_storage().data_ptr() == home.planes[plane].untyped_storage().data_ptr())

        device = frozenset(id(span) for homes, layer_parts_ in parts for g, plane, spans in layer_parts_
                           for span in spans if resident(homes, g, plane, span))
    return SpanStreamer(streams, device)


def _restore_parts(homes: LayerHomes, header: SnapshotHeader, num_heads: int, head_dim: int,
                   num_tokens: int) -> tuple[list[Part], Callable]:
    """(the parts to read the snapshot's spans into, in file order, a function to call after reading), for a layer
    of ``num_heads`` KV heads of ``head_dim``.

    Read in place when the snapshot's head groups are the cache's; otherwise into one host tensor that is then
    copied into the homes head by head (a snapshot saved with another head-group size).
    """
    g_file = header.head_group_size
    if all(home.group.size == g_file for home in homes):
        return layer_parts(homes, num_tokens), lambda: None
    if header.kv_dtype is not None:
        raise SnapshotError(f"this 8-bit snapshot was saved with head groups of {g_file}: restore it with the same")
    start, stop = saved_range(homes.window, num_tokens)
    num_groups, kv, n = num_heads // g_file, homes[0].kv, stop - start
    scratch = torch.empty((num_groups, n, header.batch, 2, g_file, head_dim), dtype=kv.dtype)

    def regroup() -> None:
        by_head = scratch.permute(1, 2, 3, 0, 4, 5).reshape(n, header.batch, 2, num_heads, head_dim)  # [n, B, 2, KVH, D]
        for home in homes:
            home.write(start, by_head[:, :, :, home.group.start : home.group.stop])

    return [(g, 0, [span]) for g, span in enumerate(scratch.unbind(0))], regroup


def snapshot_refusal(shape) -> str | None:
    """Why a model of ``shape`` (``ModelShape``) cannot have snapshots, or None. Layers that differ in K/V shape or
    share K/V (Gemma 4) are saved layer by layer (format version 5); a fixed-size state is not K/V."""
    if shape.state_layers:
        return ("snapshots keep K/V only, and this hybrid model's linear-attention or convolution "
                "layers hold a state instead: read the document again")
    return None


def _refuse_states(cache: HeadInferCache) -> None:
    reason = snapshot_refusal(cache.shape)
    if reason is not None:
        raise SnapshotError(reason)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError as error:
        raise CorruptSnapshotError(f"{path.name} is missing") from error


def check_sidecar_name(name: str) -> None:
    """Refuses a sidecar name that is no plain file name, or one of the snapshot's own files."""
    if (not SIDECAR_NAME.match(name) or name in (HEADER_FILE, PREVIOUS_HEADER_FILE, TOKENS_FILE, LAST_USED_FILE)
            or name.startswith("layer-") or not is_ntfs_name(name)):  # "aux.txt", "notes." : no file on Windows
        raise InputError(f"not a sidecar file name: {name!r}")


def write_atomically(path: Path, data: bytes) -> None:
    """``data`` as ``path``, durably: written and fsynced under a scratch name, renamed, the folder fsynced."""
    scratch = path.with_name(f".{path.name}.tmp")
    with open(scratch, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(scratch, path)
    fsync_directory(path.parent)


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "xb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
