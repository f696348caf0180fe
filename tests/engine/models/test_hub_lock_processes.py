"""Two processes pinning at once (two apps, an app and a CLI download): each pin is read, merged and written under
one exclusive cross-process lock, so no writer's pins are lost to the other's last write."""

from __future__ import annotations

import multiprocessing

from engine.models import hub_lock

PINS_EACH = 40


def _pin_many(path, who: str, start) -> None:
    """One writer: waits for the other (so their writes overlap), then pins ``PINS_EACH`` repositories of its own."""
    start.wait(timeout=120)
    for i in range(PINS_EACH):
        hub_lock.record(hub_lock.new_pin(f"{who}/model-{i}", f"{i:040x}", "main", "download"), path)


def test_two_processes_pinning_at_once_keep_every_pin(tmp_path):
    path = tmp_path / hub_lock.LOCK_NAME
    spawn = multiprocessing.get_context("spawn")  # Windows has no fork (and the Windows-shaped run forbids it)
    start = spawn.Barrier(2)
    writers = [spawn.Process(target=_pin_many, args=(path, who, start)) for who in ("first", "second")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=300)
    assert [writer.exitcode for writer in writers] == [0, 0]
    pins = hub_lock.read_lock(path)
    assert sorted(pins) == sorted(f"{who}/model-{i}" for who in ("first", "second") for i in range(PINS_EACH))
    assert all(pins[f"first/model-{i}"].sha == f"{i:040x}" for i in range(PINS_EACH))
