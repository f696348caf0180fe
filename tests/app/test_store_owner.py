"""What a killed save leaves (a ``.tmp-*`` folder) is counted until the next start, which removes it when no live
app owns the folder, and never while one does (app.saved.store_owner)."""

from __future__ import annotations

from save_owners import killed_save_is_counted_then_removed, live_owners_newer_save_is_left_alone


def test_a_killed_saves_folder_is_counted_then_removed_at_the_next_start(tmp_path):
    killed_save_is_counted_then_removed(tmp_path)


def test_a_live_owners_newer_save_is_left_alone(tmp_path):
    live_owners_newer_save_is_left_alone(tmp_path)
