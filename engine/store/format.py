"""The on-disk format of a KV-cache snapshot: a folder with raw span files and a JSON header.

    <key>/header.json      this header (written last; its own CRC-32 inside)
    <key>/tokens.bin       the document's token ids, little-endian uint32
    <key>/layer-NNN.bin    one layer's K/V: per head group in order, its tokens ``[n, B, 2, g, D]`` (8-bit: its
                           codes, then its scales), in ``dtype``, native byte order
    <key>/layer-NNN-group-GG-plane-P.bin
                           (version 3) one group's plane that the layer file leaves out: a disk-tier home,
                           linked, not copied (``kv/disk.py``). Its first ``num_bytes`` are the span; a file
                           still in use by the session that saved it may be longer (rows past the document)
    <key>/last_used        empty; its mtime is the last save or restore (least-recently-used eviction)

A *partial* snapshot (version 4, ``num_read`` set) holds the first ``num_read`` tokens of a read still under way,
checkpointed as it goes (``checkpoint.py``): instead of one layer file, each layer has part files
``layer-NNN-part-AAAAAAAAA-BBBBBBBBB.bin``, each laid out as a layer file restricted to tokens ``[A, B)``; a
sliding-window layer lists only its newest part, the window before ``num_read``. Its header is rewritten
atomically at each checkpoint, the one before kept as ``header-previous.json`` (used when a part the newest
lists fails its size or checksum: a checkpoint cut short by a kill). Its identity is the whole document's.

A snapshot of a model whose layers differ in K/V shape (version 5: Gemma 4's global layers with their own KV heads
and head_dim, its last layers reusing earlier layers' K/V) lists each layer with K/V (``kv_layers``, model indices:
a consumer layer of KV sharing holds nothing and has no file) with its KV heads and head_dim; each layer file is laid
out as above at its own ``g`` and ``D``. Uniform models are still written as version 3 / 4, which engines before
version 5 read.

Spans are per head group (``head_group_size`` KV heads): a complete snapshot restores under any resident placement,
and under another group size by regrouping head by head on the host (an 8-bit one, or a partial read, only under the
group size it was saved with). No pickle anywhere: a damaged or hostile file can fail a check, never run code.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import CorruptSnapshotError, SnapshotError
from .header_checks import LAYERED_VERSION, MAX_HEADER_BYTES, check_body, shown
from .fingerprint import (
    ModelFingerprint,
    dtype_name,
    kv_dtype,
    model_fingerprint,
    token_ids_digest,
    tokenizer_fingerprint,
)

FORMAT = "headinfer-kv-snapshot"
FORMAT_VERSION = 5  # 2: token-major homes, one span per (layer, head group); 3: plus home files; 4: partial reads;
# 5: per-layer K/V shapes
COMPLETE_VERSION = 3  # what a uniform model's complete snapshot is still written as, so an engine of version 3 reads it
PARTIAL_VERSION = 4
# LAYERED_VERSION (5, header_checks): a snapshot, complete or partial, of a model whose layers differ in K/V shape
OLDEST_READABLE = 2  # version 2 is version 3 without home files
MAX_VERSION = 1 << 16  # above FORMAT_VERSION: a newer engine's (kept, not read); above this: garbage
HEADER_FILE = "header.json"
PREVIOUS_HEADER_FILE = "header-previous.json"  # a partial snapshot's checkpoint before the newest
TOKENS_FILE = "tokens.bin"
LAST_USED_FILE = "last_used"
KEY_CHARS = 32


def layer_file(layer_idx: int) -> str:
    return f"layer-{layer_idx:03d}.bin"


def part_file(layer_idx: int, start: int, stop: int) -> str:
    return f"layer-{layer_idx:03d}-part-{start:09d}-{stop:09d}.bin"


def home_file(layer_idx: int, group_idx: int, plane: int) -> str:
    return f"layer-{layer_idx:03d}-group-{group_idx:02d}-plane-{plane}.bin"


@dataclass(frozen=True)
class SnapshotIdentity:
    """What a snapshot must match to be restored: model, K/V dtype, tokenizer and the document's ids."""

    model: ModelFingerprint
    dtype: str
    tokenizer: str
    token_ids_sha256: str
    num_tokens: int

    @property
    def key(self) -> str:
        """The snapshot's folder name: a hash of everything it must match."""
        parts = (self.model.model_type, self.model.config, self.model.weights, self.dtype, self.tokenizer,
                 self.token_ids_sha256)
        if self.model.weights_mode != "dense":  # dense keys stay as they were before weights modes existed
            parts += (self.model.weights_mode,)
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:KEY_CHARS]

    @classmethod
    def of(cls, model, tokenizer, token_ids: list[int]) -> SnapshotIdentity:
        return cls(model_fingerprint(model), dtype_name(kv_dtype(model)), tokenizer_fingerprint(tokenizer),
                   token_ids_digest(token_ids), len(token_ids))


@dataclass(frozen=True)
class FileEntry:
    name: str
    num_bytes: int  # the bytes the snapshot holds (and the CRC covers): the whole file, or a home file's prefix
    crc32: int
    layer: int | None = None  # set for a home file: the (layer, head group, plane) whose span it holds
    group: int | None = None
    plane: int | None = None
    start: int | None = None  # set for a part file of a partial snapshot: its layer's tokens [start, stop)
    stop: int | None = None

    @property
    def is_home(self) -> bool:
        return self.layer is not None and self.start is None

    @property
    def is_part(self) -> bool:
        return self.start is not None


@dataclass(frozen=True)
class SnapshotHeader:
    """Everything needed to check a snapshot against a session before reading a byte of K/V."""

    identity: SnapshotIdentity
    label: str
    created: float  # seconds since the epoch
    num_layers: int
    num_kv_heads: int
    head_dim: int
    batch: int
    files: tuple[FileEntry, ...]
    policy: dict = field(default_factory=dict)  # informational: the policy of the session that saved it
    byteorder: str = sys.byteorder
    version: int = COMPLETE_VERSION
    head_group_size: int = 1  # the layer files hold one [tokens, B, 2, g, D] span per group of this many heads
    kv_dtype: str | None = None  # 8-bit host KV ("int8" / "fp8"): each group's codes then its scales
    num_read: int | None = None  # a partial snapshot: the document's first tokens it holds (None: all of them)
    read_seconds: float = 0.0  # a partial snapshot: the reading time those tokens took (for an estimate of the rest)
    # Version 5 (``layer_shapes``): the model index of each layer with files, and its KV heads and head_dim, in
    # file order; empty: layers 0..num_layers-1, each of num_kv_heads x head_dim (those two are the largest then).
    kv_layers: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    layer_head_dims: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        return self.identity.key

    @property
    def num_saved(self) -> int:
        """Tokens the snapshot restores: the whole document, or a partial read's first ``num_read``."""
        return self.identity.num_tokens if self.num_read is None else self.num_read

    @property
    def num_bytes(self) -> int:
        return sum(f.num_bytes for f in self.files)

    @property
    def layer_shapes(self) -> tuple[tuple[int, int, int], ...]:
        """(model layer index, KV heads, head_dim) of each layer the snapshot holds K/V of, in file order."""
        if not self.kv_layers:
            return tuple((i, self.num_kv_heads, self.head_dim) for i in range(self.num_layers))
        return tuple(zip(self.kv_layers, self.layer_kv_heads, self.layer_head_dims))

    def to_json(self) -> str:
        body = asdict(self)
        if not self.kv_layers:  # a uniform model's header stays what engines of version 3 / 4 read
            del body["kv_layers"], body["layer_kv_heads"], body["layer_head_dims"]
        if self.num_read is None:  # a complete snapshot's header stays what engines of version 3 read
            del body["num_read"], body["read_seconds"]
            for entry in body["files"]:
                del entry["start"], entry["stop"]
        body["format"] = FORMAT
        body["header_crc32"] = _crc_of(body)
        return json.dumps(body, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SnapshotHeader:
        """Parses a header; raises ``CorruptSnapshotError`` if it is malformed or altered."""
        try:
            body = json.loads(text)
            stored_crc = body.pop("header_crc32")
            if body.pop("format") != FORMAT:
                raise CorruptSnapshotError("unreadable snapshot header (not a HeadInfer KV snapshot)")
            if stored_crc != _crc_of({**body, "format": FORMAT}):
                raise CorruptSnapshotError("unreadable snapshot header (the header does not match its checksum)")
            version = body["version"]
            if type(version) is not int or version > MAX_VERSION:
                raise CorruptSnapshotError(f"unreadable snapshot header (version {shown(version)})")
            if version < OLDEST_READABLE:
                raise CorruptSnapshotError(f"snapshot format version {version} is from an older engine "
                                           "layout; read the document again to replace it")
            if version > FORMAT_VERSION:
                raise SnapshotError(f"snapshot format version {version} (this engine reads {FORMAT_VERSION})")
            check_body(body)  # every field of its type and in range: a recomputed CRC proves nothing
            identity = body.pop("identity")
            layers = {key: tuple(body.pop(key, ())) for key in ("kv_layers", "layer_kv_heads", "layer_head_dims")}
            return cls(identity=SnapshotIdentity(model=ModelFingerprint(**identity.pop("model")), **identity),
                       files=tuple(FileEntry(**f) for f in body.pop("files")), **layers, **body)
        except SnapshotError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
            raise CorruptSnapshotError(f"unreadable snapshot header ({type(error).__name__}: "
                                       f"{str(error)[:200]})") from error


def shape_fields(cache, version: int) -> dict:
    """The ``SnapshotHeader`` fields that give ``cache``'s K/V shape (its homes allocated): one KV-head count and
    head_dim in ``version`` (3 or 4) for a uniform model, else each layer's in version 5."""
    layers = cache.kv_layers
    kv = [layer.homes[0].kv for layer in layers]  # each [capacity, B, 2, g, D]
    heads = tuple(sum(home.group.size for home in layer.homes) for layer in layers)
    dims = tuple(k.shape[4] for k in kv)
    fields = {"num_layers": len(layers), "num_kv_heads": max(heads), "head_dim": max(dims), "batch": kv[0].shape[1],
              "head_group_size": kv[0].shape[3], "version": version}
    if len(set(zip(heads, dims))) > 1 or [layer.layer_idx for layer in layers] != list(range(len(layers))):
        fields.update(version=LAYERED_VERSION, kv_layers=tuple(layer.layer_idx for layer in layers),
                      layer_kv_heads=heads, layer_head_dims=dims)
    return fields


def read_header(folder: Path, name: str = HEADER_FILE) -> SnapshotHeader:
    """The header of the snapshot in ``folder``; ``CorruptSnapshotError`` when missing or damaged."""
    try:
        with open(folder / name, "rb") as file:
            data = file.read(MAX_HEADER_BYTES + 1)
        if len(data) > MAX_HEADER_BYTES:
            raise CorruptSnapshotError(f"{folder.name}'s {name} is over {MAX_HEADER_BYTES >> 20} MiB")
        text = data.decode("utf-8")
    except FileNotFoundError as error:
        raise CorruptSnapshotError(f"{folder.name} has no {name}") from error
    except (OSError, UnicodeDecodeError) as error:
        raise CorruptSnapshotError(f"cannot read {folder / name}: {error}") from error
    return SnapshotHeader.from_json(text)


def check_compatible(header: SnapshotHeader, wanted: SnapshotIdentity, shape) -> None:
    """Raises ``SnapshotError`` saying how the snapshot differs from what the session needs.

    ``shape`` is the session's ``ModelShape``. The dtype is checked before the model so a cast of the
    same model is reported as a dtype mismatch.
    """
    saved = header.identity
    if header.byteorder != sys.byteorder:
        raise SnapshotError(f"the snapshot was saved on a {header.byteorder}-endian machine; this one is {sys.byteorder}-endian")
    if saved.dtype != wanted.dtype:
        raise SnapshotError(f"the snapshot holds {saved.dtype} K/V but this model runs in {wanted.dtype}")
    difference = saved.model.difference(wanted.model)
    if difference is not None:
        raise SnapshotError(f"the snapshot was made with another model ({difference}): saved with "
                            f"{saved.model.describe()}, this session runs {wanted.model.describe()}")
    if saved.tokenizer != wanted.tokenizer:
        raise SnapshotError(f"the snapshot was made with another tokenizer (fingerprint {saved.tokenizer[:8]}, "
                            f"this session's is {wanted.tokenizer[:8]})")
    if (saved.num_tokens, saved.token_ids_sha256) != (wanted.num_tokens, wanted.token_ids_sha256):
        raise SnapshotError(f"the snapshot holds another document ({saved.num_tokens:,} tokens, "
                            f"{header.label!r}) than this session's ({wanted.num_tokens:,} tokens)")
    wanted_layers = tuple(zip(shape.kv_layer_indices, shape.kv_heads, shape.head_dims))
    if header.layer_shapes != wanted_layers:
        raise CorruptSnapshotError(
            f"the snapshot's cache shape ({_shapes(header.layer_shapes)}) differs from the model's "
            f"({_shapes(wanted_layers)})")
    if header.num_read is not None:
        _check_parts(header)
        return
    homes = [f for f in header.files if f.is_home]
    groups = {layer: heads // header.head_group_size for layer, heads, _ in header.layer_shapes}
    num_planes = 1 if header.kv_dtype is None else 2
    expected = {TOKENS_FILE, *(layer_file(i) for i in groups), *(home_file(f.layer, f.group, f.plane) for f in homes)}
    if ({f.name for f in header.files} != expected or len(header.files) != len(expected)
            or not all(f.layer in groups and 0 <= f.group < groups[f.layer] and 0 <= f.plane < num_planes
                       for f in homes)):
        raise CorruptSnapshotError("the snapshot's header lists the wrong files")


def _shapes(layers: tuple[tuple[int, int, int], ...]) -> str:
    """'3 layers x 2 KV heads x 16' (one shape), else each layer's 'heads x dim' by its index."""
    if len({(heads, dim) for _, heads, dim in layers}) <= 1 and all(i == k for k, (i, _, _) in enumerate(layers)):
        heads, dim = (layers[0][1], layers[0][2]) if layers else (0, 0)
        return f"{len(layers)} layers x {heads} KV heads x {dim}"
    return ", ".join(f"layer {i}: {heads} x {dim}" for i, heads, dim in layers)


def _check_parts(header: SnapshotHeader) -> None:
    """A partial snapshot lists its tokens file and well-named parts inside the document (coverage is checked
    against each layer's window when it is read)."""
    parts = [f for f in header.files if f.is_part]
    names = [f.name for f in header.files]
    if (not 0 < header.num_read <= header.identity.num_tokens or TOKENS_FILE not in names
            or len(names) != len(set(names)) or len(parts) != len(names) - 1
            or not all(f.layer in {i for i, _, _ in header.layer_shapes} and 0 <= f.start < f.stop <= header.num_read
                       and f.name == part_file(f.layer, f.start, f.stop) for f in parts)):
        raise CorruptSnapshotError("the partial snapshot's header lists the wrong files")


def _crc_of(body: dict) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())
