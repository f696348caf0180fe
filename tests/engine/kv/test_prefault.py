"""Host memory is faulted in on a few threads before it is page-locked (the H200 run pinned 116 GiB in 98.6 s)."""

from __future__ import annotations

import ctypes
import mmap
import threading

import torch

from engine.kv import pinned, prefault

PAGE = mmap.PAGESIZE


def resident_pages(buffer: torch.Tensor) -> tuple[int, int]:
    """(pages of ``buffer`` in RAM, pages) from ``mincore``."""
    start = buffer.data_ptr() - buffer.data_ptr() % PAGE
    length = buffer.data_ptr() + buffer.numel() * buffer.element_size() - start
    pages = -(-length // PAGE)
    vector = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vector) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vector), pages


def test_a_big_buffer_is_faulted_in_on_several_threads(monkeypatch):
    monkeypatch.setattr(prefault.os, "cpu_count", lambda: 4)
    buffer = torch.empty(4 * prefault.BYTES_PER_THREAD, dtype=torch.uint8)  # fresh mmap: address space only
    before, pages = resident_pages(buffer)
    assert before < pages // 2
    names = set()
    real_populate = prefault._populate
    monkeypatch.setattr(prefault, "_populate",
                        lambda *a: (names.add(threading.current_thread().name), real_populate(*a))[1])
    assert prefault.prefault(buffer) == 4
    assert resident_pages(buffer) == (pages, pages)
    assert len(names) > 1 and all(name.startswith("prefault") for name in names)  # a pool reuses idle threads


def test_the_one_byte_per_page_fallback_touches_every_page_and_changes_nothing(monkeypatch):
    monkeypatch.setattr(prefault, "_madvise", lambda pointer, length: False)  # a kernel before 5.14
    buffer = torch.empty(3 * prefault.BYTES_PER_THREAD + 123, dtype=torch.uint8)
    buffer[: PAGE * 4].fill_(7)
    prefault.prefault(buffer)
    assert resident_pages(buffer)[0] == resident_pages(buffer)[1]
    assert int(buffer[: PAGE * 4].min()) == 7 == int(buffer[: PAGE * 4].max())


def test_small_buffers_stay_on_the_calling_thread():
    assert prefault.num_threads(1 << 20) == 1 and prefault.prefault(torch.empty(1 << 20, dtype=torch.uint8)) == 1


def test_host_memory_registers_only_pages_already_faulted_in(monkeypatch):
    """What ``cudaHostRegister`` is handed is resident before the call: the driver faults nothing itself."""
    seen = []

    class Runtime:
        def host_register(self, pointer: int, num_bytes: int) -> int:
            region = (ctypes.c_ubyte * num_bytes).from_address(pointer)
            seen.append(resident_pages(torch.frombuffer(region, dtype=torch.uint8)))
            return 0

        def host_unregister(self, pointer: int) -> int:
            return 0

    memory = pinned.HostMemory(True, fence=lambda: None, runtime=Runtime())
    tensor = memory.empty((prefault.BYTES_PER_THREAD // 4, 2), torch.float32)
    (resident, pages), = seen
    assert resident == pages and tensor.numel() * 4 <= pages * PAGE
    memory.free_all()
