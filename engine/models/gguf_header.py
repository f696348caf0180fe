"""A GGUF file's header alone: its metadata and tensor table, read through a memory map without touching weights.

``gguf.GGUFReader`` builds a numpy array per vocabulary string (seconds for a 150K-token vocabulary) and a view per
tensor; discovery needs a few numbers per file, so this walks the header once: string arrays are skipped by their
length prefixes and only counted. It also says whether the file holds every byte its tensor table names, which is
how a partial download (a truncated file) is told from a model.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import GGUFHeaderError

MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@dataclass(frozen=True)
class GGUFHeader:
    fields: dict  # key -> value; a string array is kept as its length only (``ArrayLength``)
    num_params: int  # elements of every tensor in this file
    data_bytes: int  # bytes the tensor table says the data section holds
    data_offset: int
    file_size: int
    tensors: tuple[TensorInfo, ...] = ()  # the tensor table, in the file's order


    @property
    def is_complete(self) -> bool:
        """Every tensor's bytes are in the file (a download cut short is not)."""
        return self.data_offset + self.data_bytes <= self.file_size


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table."""

    name: str
    shape: tuple[int, ...]  # ggml's order: the innermost (row) dimension first
    qtype: int  # a ``GGMLQuantizationType`` value
    offset: int  # bytes from the start of the data section

    @property
    def row_bytes(self) -> int:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(self.qtype)]
        return self.shape[0] // block * block_bytes


class ArrayLength(int):
    """The length of a string array (a vocabulary), standing in for the strings themselves."""


def read_header(path: str | Path) -> GGUFHeader:
    """The header of the GGUF file at ``path``; raises ``GGUFHeaderError`` or ``OSError``."""
    with open(path, "rb") as file:
        size = file.seek(0, 2)
        if size < 24:
            raise GGUFHeaderError(f"{path}: {size} bytes, too short for a GGUF header")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _Parser(data, size, str(path)).header()


class _Parser:
    def __init__(self, data: mmap.mmap, size: int, name: str):
        self.data, self.size, self.name, self.at = data, size, name, 0

    def header(self) -> GGUFHeader:
        if self.data[:4] != MAGIC:
            raise GGUFHeaderError(f"{self.name}: not a GGUF file")
        self.at = 4
        version = self._scalar(4)
        if version not in (2, 3):
            raise GGUFHeaderError(f"{self.name}: GGUF version {version} (only 2 and 3, little-endian, are read)")
        num_tensors, num_fields = self._scalar(10), self._scalar(10)
        fields = {}
        for _ in range(num_fields):
            key = self._string()
            fields[key] = self._value(self._scalar(4))
        num_params = data_bytes = 0
        tensors = []
        for _ in range(num_tensors):
            name = self._string()
            dims = [self._scalar(10) for _ in range(self._scalar(4))]
            kind, offset = self._scalar(4), self._scalar(10)
            elements = 1
            for dim in dims:
                elements *= dim
            try:
                block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            except (ValueError, KeyError) as error:
                raise GGUFHeaderError(f"{self.name}: unknown tensor type {kind}") from error
            num_params += elements
            data_bytes = max(data_bytes, offset + elements // block * block_bytes)
            tensors.append(TensorInfo(name, tuple(dims), kind, offset))
        alignment = int(fields.get("general.alignment", 32)) or 32
        data_offset = -(-self.at // alignment) * alignment
        return GGUFHeader(fields, num_params, data_bytes, data_offset, self.size, tuple(tensors))

    def _take(self, n: int) -> int:
        start = self.at
        self.at += n
        if self.at > self.size:
            raise GGUFHeaderError(f"{self.name}: the header is cut short at byte {start:,}")
        return start

    def _scalar(self, kind: int):
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise GGUFHeaderError(f"{self.name}: unknown value type {kind}")
        return struct.unpack_from(fmt, self.data, self._take(struct.calcsize(fmt)))[0]

    def _string(self) -> str:
        length = self._scalar(10)
        start = self._take(length)
        return self.data[start : start + length].decode("utf-8", errors="replace")

    def _value(self, kind: int):
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            return self._scalar(kind)
        item, count = self._scalar(4), self._scalar(10)
        if item == _STRING:  # a vocabulary: skipped by the length prefixes, only counted
            for _ in range(count):
                self._take(struct.unpack_from("<Q", self.data, self._take(8))[0])
            return ArrayLength(count)
        if item == _ARRAY:
            return [self._value(_ARRAY) for _ in range(count)]
        fmt = _SCALARS.get(item)
        if fmt is None:
            raise GGUFHeaderError(f"{self.name}: unknown array item type {item}")
        width = struct.calcsize(fmt)
        start = self._take(width * count)
        if count > 1024:  # scores, token types: only their count matters here (per-layer lists are kept)
            return ArrayLength(count)
        return list(struct.unpack_from(f"<{count}{fmt[1]}", self.data, start))


def tensor_arrays(path: str | Path, header: GGUFHeader) -> list[tuple[TensorInfo, np.ndarray]]:
    """Each tensor with its bytes as gguf-py's reader lays them out, mapped copy-on-write (writable for torch, the
    file never written): uint8 ``[rows (numpy order, outer first)..., row_bytes]``, which gguf-py's ``dequantize``
    takes for every type. Raises ``GGUFHeaderError`` for a file cut short."""
    if not header.is_complete:
        raise GGUFHeaderError(f"{path}: {header.file_size:,} bytes, the tensor table needs "
                              f"{header.data_offset + header.data_bytes:,}")
    data = np.memmap(path, dtype=np.uint8, mode="c", offset=header.data_offset,
                     shape=(header.file_size - header.data_offset,))
    arrays = []
    for tensor in header.tensors:
        rows = tuple(reversed(tensor.shape[1:]))
        size = tensor.row_bytes * int(np.prod(rows, dtype=np.int64))
        arrays.append((tensor, data[tensor.offset : tensor.offset + size].reshape(*rows, tensor.row_bytes)))
    return arrays
