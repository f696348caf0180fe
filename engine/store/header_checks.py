"""What a snapshot header's fields may hold, checked before any of them is used.

The header's CRC-32 catches damage, not intent: anyone who can write a header can recompute it. So every field is
checked for its type and a sane range here (``SnapshotHeader.from_json`` calls ``check_body`` on the parsed JSON),
and anything else is a ``CorruptSnapshotError``: the snapshot counts as damaged (listed as such, deleted on restore)
instead of a ``TypeError``, ``KeyError`` or a huge allocation in whichever handler touched it first.
"""

from __future__ import annotations

import math
import re
import reprlib

from ..errors import CorruptSnapshotError

MAX_TOKENS = 1 << 31  # token ids are uint32 and no model reads more than this
MAX_LAYERS = 4096
MAX_HEADS = 4096
MAX_HEAD_DIM = 4096
MAX_BATCH = 1024
MAX_FILES = 1 << 19  # a partial read's parts: layers x checkpoints
MAX_HEADER_BYTES = 64 << 20  # what ``read_header`` reads at most
MAX_FILE_BYTES = 1 << 50
MAX_TEXT = 1 << 16  # labels, names and fingerprints: a header is a few KB
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a plain name in the snapshot's folder
_KV_DTYPES = (None, "int8", "fp8")
_BYTEORDERS = ("little", "big")

_HEADER_KEYS = {"identity", "label", "created", "num_layers", "num_kv_heads", "head_dim", "batch", "files",
                "policy", "byteorder", "version", "head_group_size", "kv_dtype", "num_read", "read_seconds",
                "kv_layers", "layer_kv_heads", "layer_head_dims"}
_LAYER_KEYS = ("kv_layers", "layer_kv_heads", "layer_head_dims")
LAYERED_VERSION = 5  # the first version whose headers may list per-layer K/V shapes (``format.py``)
_REQUIRED = {"identity", "label", "created", "num_layers", "num_kv_heads", "head_dim", "batch", "files"}
_IDENTITY_KEYS = {"model", "dtype", "tokenizer", "token_ids_sha256", "num_tokens"}
_MODEL_KEYS = {"model_type", "name", "config", "weights", "weights_mode"}
_PLACES = (frozenset(), frozenset({"layer", "group", "plane"}), frozenset({"layer", "start", "stop"}))
_FILE_KEYS = {"name", "num_bytes", "crc32", "layer", "group", "plane", "start", "stop"}


def check_body(body: dict) -> None:
    """Raises ``CorruptSnapshotError`` unless ``body`` (a parsed header, ``format`` and CRC removed) has exactly
    the fields a ``SnapshotHeader`` takes, each of its type and within range."""
    _keys(body, _HEADER_KEYS, _REQUIRED, "the header")
    identity = body["identity"]
    _keys(identity, _IDENTITY_KEYS, _IDENTITY_KEYS, "the header's identity")
    _keys(identity["model"], _MODEL_KEYS, _MODEL_KEYS - {"weights_mode"}, "the header's model")
    for key in _MODEL_KEYS & identity["model"].keys():
        _text(identity["model"][key], f"model.{key}")
    for key in ("dtype", "tokenizer", "token_ids_sha256"):
        _text(identity[key], key)
    num_tokens = _integer(identity["num_tokens"], "num_tokens", 0, MAX_TOKENS)
    _text(body["label"], "label")
    _number(body["created"], "created")
    num_layers = _integer(body["num_layers"], "num_layers", 1, MAX_LAYERS)
    num_heads = _integer(body["num_kv_heads"], "num_kv_heads", 1, MAX_HEADS)
    head_dim = _integer(body["head_dim"], "head_dim", 1, MAX_HEAD_DIM)
    _integer(body["batch"], "batch", 1, MAX_BATCH)
    group = _integer(body.get("head_group_size", 1), "head_group_size", 1, num_heads)
    version = _integer(body.get("version", 0), "version", 0, 1 << 16)
    layers = _layers(body, num_layers, num_heads, head_dim, version)
    if any(heads % group for _, heads in layers):
        raise CorruptSnapshotError(f"unreadable snapshot header (head groups of {group} do not divide "
                                   f"{'/'.join(str(heads) for _, heads in layers)} KV heads)")
    if not isinstance(body.get("policy", {}), dict):
        raise CorruptSnapshotError("unreadable snapshot header (policy is not an object)")
    if body.get("byteorder", "little") not in _BYTEORDERS:
        raise CorruptSnapshotError("unreadable snapshot header (byteorder)")
    if body.get("kv_dtype") not in _KV_DTYPES:
        raise CorruptSnapshotError(f"unreadable snapshot header (kv_dtype {shown(body.get('kv_dtype'))})")
    if body.get("num_read") is not None:
        _integer(body["num_read"], "num_read", 1, num_tokens)
    _number(body.get("read_seconds", 0.0), "read_seconds")
    files = body["files"]
    if not isinstance(files, list) or not 0 < len(files) <= MAX_FILES:
        raise CorruptSnapshotError("unreadable snapshot header (files is not a list of files)")
    last_layer = max(layer for layer, _ in layers)
    for entry in files:
        _file(entry, last_layer, num_tokens)


def _layers(body: dict, num_layers: int, num_heads: int, head_dim: int, version: int) -> list[tuple[int, int]]:
    """(model layer index, KV heads) of each layer with files: version 5's per-layer lists (one entry a layer, layer
    indices rising, the largest heads and head_dim the header's), else layers 0..num_layers-1 of num_kv_heads."""
    given = [key for key in _LAYER_KEYS if key in body]
    if not given:
        return [(i, num_heads) for i in range(num_layers)]
    if len(given) != len(_LAYER_KEYS) or version < LAYERED_VERSION:
        raise CorruptSnapshotError(f"unreadable snapshot header (per-layer shapes {', '.join(given)} in a "
                                   f"version {version} header)")
    lists = [body[key] for key in _LAYER_KEYS]
    if not all(isinstance(values, list) and len(values) == num_layers for values in lists):
        raise CorruptSnapshotError(f"unreadable snapshot header (per-layer shapes are not {num_layers} entries each)")
    indices = [_integer(i, "kv_layers", 0, MAX_LAYERS - 1) for i in lists[0]]
    heads = [_integer(h, "layer_kv_heads", 1, num_heads) for h in lists[1]]
    dims = [_integer(d, "layer_head_dims", 1, head_dim) for d in lists[2]]
    if any(a >= b for a, b in zip(indices, indices[1:])) or max(heads) != num_heads or max(dims) != head_dim:
        raise CorruptSnapshotError("unreadable snapshot header (per-layer shapes out of order or past the largest)")
    return list(zip(indices, heads))


def _file(entry, last_layer: int, num_tokens: int) -> None:
    _keys(entry, _FILE_KEYS, {"name", "num_bytes", "crc32"}, "a file entry")
    if not isinstance(entry["name"], str) or not _FILE_NAME.match(entry["name"]):
        raise CorruptSnapshotError(f"unreadable snapshot header (file name {shown(entry['name'])})")
    _integer(entry["num_bytes"], "num_bytes", 0, MAX_FILE_BYTES)
    _integer(entry["crc32"], "crc32", 0, 0xFFFFFFFF)
    limits = {"layer": last_layer, "group": MAX_HEADS, "plane": 1, "start": num_tokens, "stop": num_tokens}
    for key, top in limits.items():
        if entry.get(key) is not None:
            _integer(entry[key], key, 0, top)
    where = frozenset(key for key in limits if entry.get(key) is not None)
    if where not in _PLACES:  # a layer or tokens file, a home file (layer, group, plane) or a part file (layer, start, stop)
        raise CorruptSnapshotError(f"unreadable snapshot header ({shown(entry['name'])} is placed by "
                                   f"{', '.join(sorted(where))})")


def _keys(value, allowed: set[str], required: set[str], what: str) -> None:
    if not isinstance(value, dict):
        raise CorruptSnapshotError(f"unreadable snapshot header ({what} is not an object)")
    missing, unknown = required - value.keys(), value.keys() - allowed
    if missing or unknown:
        names = ", ".join(sorted(shown(k) for k in missing | unknown)[:5])
        raise CorruptSnapshotError(f"unreadable snapshot header ({what}: {'missing' if missing else 'unknown'} "
                                   f"{names})")


def _integer(value, name: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:  # bool is an int subclass: refused
        raise CorruptSnapshotError(f"unreadable snapshot header ({name} {shown(value)} is not an integer in "
                                   f"[{low:,}, {high:,}])")
    return value


def _number(value, name: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise CorruptSnapshotError(f"unreadable snapshot header ({name} {shown(value)} is not a time)")
    return float(value)


def _text(value, name: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise CorruptSnapshotError(f"unreadable snapshot header ({name} is not a short text)")
    return value


def shown(value) -> str:
    """A hostile value in a message: short, whatever its size or nesting."""
    return reprlib.repr(value)[:40]
