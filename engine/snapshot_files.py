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
import shutil
import tempfile
import time
from pathlib import Path

import torch

from .cache import HeadInferCache
from .fingerprint import dtype_name, token_ids_bytes
from .kv import LayerHomes
from .snapshot_format import (
    HEADER_FILE,
    LAST_USED_FILE,
    TOKENS_FILE,
    CorruptSnapshotError,
    FileEntry,
    SnapshotError,
    SnapshotHeader,
    SnapshotIdentity,
    layer_file,
)
from .snapshot_io import ChecksumMismatch, RunStreamer, TruncatedFile, fsync_directory

logger = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"


def saved_range(window: int | None, num_tokens: int) -> tuple[int, int]:
    """Tokens a layer's file holds: all of them, or for a sliding-window layer the window before the end."""
    return (0 if window is None else max(0, num_tokens - (window - 1)), num_tokens)


def layer_runs(homes: LayerHomes, num_tokens: int) -> list[torch.Tensor]:
    """The layer's saved tokens as contiguous runs in file order: per group, its [n, B, 2, g, D] tokens in order
    (two runs where a window ring wraps)."""
    start, stop = saved_range(homes.window, num_tokens)
    return [run for home in homes for plane in range(len(home.planes)) for run in home.blocks(start, stop, plane)]


def snapshot_bytes(cache: HeadInferCache, num_tokens: int) -> int:
    """The size a snapshot of the cache's first ``num_tokens`` tokens takes on disk (headers aside)."""
    home = cache.layers[0].homes[0]
    per_token = sum(p[0].nbytes for p in home.planes) * cache.shape.num_kv_heads // home.group.size
    tokens = sum(stop - start for start, stop in (saved_range(w, num_tokens) for w in cache.shape.sliding_windows))
    return tokens * per_token + 4 * num_tokens


def write_snapshot(target: Path, cache: HeadInferCache, identity: SnapshotIdentity, token_ids: list[int], *,
                   label: str = "", policy: dict | None = None) -> SnapshotHeader:
    """Saves the first ``identity.num_tokens`` tokens of ``cache`` as the snapshot folder ``target``.

    Raises ``FileExistsError`` if ``target`` appeared meanwhile (another writer won), ``OSError`` on a
    write failure; either way nothing is left behind but what was there before.
    """
    num_tokens = identity.num_tokens
    if any(layer.homes is None or layer.length < num_tokens for layer in cache.layers):
        raise ValueError(f"the cache does not hold the {num_tokens:,} tokens to save")
    home = cache.layers[0].homes[0]
    batch, group_size, head_dim = home.kv.shape[1], home.kv.shape[3], home.kv.shape[4]
    if dtype_name(home.dtype) != identity.dtype:
        raise ValueError(f"the cache holds {home.dtype} K/V but the model runs in {identity.dtype}")
    cache.synchronize()  # host homes are complete only once the asynchronous appends have landed
    scratch = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{target.name}-", dir=target.parent))
    try:
        with RunStreamer() as streamer:
            ids = torch.frombuffer(bytearray(token_ids_bytes(token_ids)), dtype=torch.uint8)
            files = [FileEntry(TOKENS_FILE, *streamer.write_file(scratch / TOKENS_FILE, [ids]))]
            for layer in cache.layers:
                name = layer_file(layer.layer_idx)
                runs = layer_runs(layer.homes, num_tokens)
                files.append(FileEntry(name, *streamer.write_file(scratch / name, runs)))
        header = SnapshotHeader(identity, label, time.time(), len(cache.layers), cache.shape.num_kv_heads,
                                head_dim, batch, tuple(files), policy or {}, head_group_size=group_size,
                                kv_dtype=cache.policy.kv_dtype)
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
        if size != entry.num_bytes:
            what = "truncated" if size < entry.num_bytes else "longer than its header says"
            raise CorruptSnapshotError(f"{entry.name} is {what} ({size:,} of {entry.num_bytes:,} bytes)")
    num_tokens = header.identity.num_tokens
    _prepare(cache, header)
    entries = {f.name: f for f in header.files}
    try:
        with RunStreamer() as streamer:
            per_layer = [_restore_runs(layer.homes, header, num_tokens) for layer in cache.layers]
            streamer.prefault([run for runs, _ in per_layer for run in runs])
            ids = torch.empty(entries[TOKENS_FILE].num_bytes, dtype=torch.uint8)
            total = streamer.read_file(folder / TOKENS_FILE, [ids], entries[TOKENS_FILE].crc32)
            if hashlib.sha256(ids.numpy()).hexdigest() != header.identity.token_ids_sha256:
                raise ChecksumMismatch(f"{TOKENS_FILE} holds other token ids than the header says")
            for layer, (runs, regroup) in zip(cache.layers, per_layer):
                name = layer_file(layer.layer_idx)
                total += streamer.read_file(folder / name, runs, entries[name].crc32)
                regroup()
    except (TruncatedFile, ChecksumMismatch) as error:
        raise CorruptSnapshotError(f"{error}: the snapshot is damaged") from error
    except FileNotFoundError as error:
        raise CorruptSnapshotError(f"a snapshot file is missing ({error.filename})") from error
    for layer in cache.layers:
        layer.length = num_tokens
    return total


def _prepare(cache: HeadInferCache, header: SnapshotHeader) -> None:
    """Empties the cache and makes sure its homes match the snapshot (dtype, batch, head_dim, capacity)."""
    if header.kv_dtype != cache.policy.kv_dtype:
        stored = lambda kind: kind or "the model's dtype"  # noqa: E731
        raise SnapshotError(f"the snapshot holds K/V in {stored(header.kv_dtype)}, this session keeps "
                            f"{stored(cache.policy.kv_dtype)}: read the document again")
    dtype = getattr(torch, header.identity.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptSnapshotError(f"unknown dtype {header.identity.dtype!r} in the header")
    homes = cache.layers[0].homes
    if homes is not None:
        kv = homes[0].kv
        if (homes[0].dtype, kv.shape[1], kv.shape[4]) != (dtype, header.batch, header.head_dim):
            cache.release()
    if cache.layers[0].homes is None:
        cache.allocate(header.batch, header.head_dim, dtype, cache.device)
    else:
        cache.crop_to(0)  # waits for copies in flight and drops stale prefetches
    cache.reserve(header.identity.num_tokens)


def _restore_runs(homes: LayerHomes, header: SnapshotHeader, num_tokens: int):
    """(runs to read the layer file into, a function to call after reading).

    Read in place when the snapshot's head groups are the cache's; otherwise into one host tensor that is then
    copied into the homes head by head (a snapshot saved with another head-group size).
    """
    g_file = header.head_group_size
    if all(home.group.size == g_file for home in homes):
        return layer_runs(homes, num_tokens), lambda: None
    if header.kv_dtype is not None:
        raise SnapshotError(f"this 8-bit snapshot was saved with head groups of {g_file}: restore it with the same")
    start, stop = saved_range(homes.window, num_tokens)
    num_groups, kv, n = header.num_kv_heads // g_file, homes[0].kv, stop - start
    scratch = torch.empty((num_groups, n, header.batch, 2, g_file, header.head_dim), dtype=kv.dtype)

    def regroup() -> None:
        by_head = scratch.permute(1, 2, 3, 0, 4, 5).reshape(n, header.batch, 2, header.num_kv_heads,
                                                           header.head_dim)  # [n, B, 2, KVH, D]
        for home in homes:
            home.write(start, by_head[:, :, :, home.group.start : home.group.stop])

    return list(scratch.unbind(0)), regroup


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError as error:
        raise CorruptSnapshotError(f"{path.name} is missing") from error


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "xb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
