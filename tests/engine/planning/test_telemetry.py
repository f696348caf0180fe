"""Tests for memory readings, budgets and throughput tracking (CPU-only friendly)."""

import pytest

from engine.planning.machine import MemorySnapshot, format_bytes, read_memory


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_read_memory_has_sane_host_numbers():
    snap = read_memory()
    assert isinstance(snap, MemorySnapshot)
    assert 0 < snap.process_rss < snap.system_total
    assert 0 < snap.system_used <= snap.system_total
    assert 0 < snap.system_available <= snap.system_total
    if not _has_cuda():
        assert (snap.gpu_used, snap.gpu_total, snap.gpu_name) == (None, None, None)


def test_read_memory_bad_gpu_index_does_not_raise():
    snap = read_memory(gpu_index=99)
    assert snap.gpu_used is None and snap.gpu_total is None


@pytest.mark.parametrize(
    ("n", "text"),
    [(None, "n/a"), (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
     (5 * 2**20, "5.00 MiB"), (int(1.23 * 2**30), "1.23 GiB"), (3 * 2**40, "3.00 TiB"),
     (2**50, "1024.00 TiB"), (-2048, "-2.00 KiB")],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text
