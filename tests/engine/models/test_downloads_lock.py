"""Trust on first use: a catalogue model whose revision is ``main`` is pinned by its first download (the lock file in
the studio's cache folder), and a repository changed upstream afterwards changes nothing this machine runs until the
owner updates the pin. Against the local fake Hub (``hub_server``), which can push a new commit to main."""

from __future__ import annotations

import json
import os

import pytest

from engine.errors import DamagedRevisionLock, DownloadCancelled, ModelSourceError, RevisionLockMismatch
from engine.models import downloads, hub_lock
from engine.models.downloads import UNPINNED, DownloadJob, cached_snapshot, pin_status, update_pin
from hub_server import COMMIT, HubServer

REPO = "studio-tests/unpinned-model"
PINNED = "studio-tests/pinned-model"
PINNED_SHA = "fedcba9876543210fedcba9876543210fedcba98"
FIRST = {"config.json": b'{"model_type": "llama", "v": 1}', "model.safetensors": os.urandom(1 << 20)}
LATER = {"config.json": b'{"model_type": "llama", "v": 2}', "model.safetensors": os.urandom(1 << 20)}


@pytest.fixture
def catalogue(tmp_path, monkeypatch, own_lock):
    """A catalogue with one entry on ``main`` and one pinned to a commit; returns the Hugging Face cache folder."""
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps({"models": [{"id": REPO, "revision": "main"}, {"id": PINNED, "revision": PINNED_SHA}]}))
    monkeypatch.setattr(downloads, "CATALOGUE", path)
    return tmp_path / "hub-cache"


def _asked(hub) -> list[str]:
    return [path for _, path, _ in hub.requests]


def test_the_first_download_pins_main_and_a_later_push_changes_nothing(catalogue, own_lock):
    with HubServer(REPO, FIRST) as hub:
        first = DownloadJob(REPO, cache_dir=catalogue, endpoint=hub.endpoint).run()
        pin = hub_lock.locked(REPO)
        assert pin is not None and (pin.sha, pin.branch, pin.how) == (COMMIT, "main", "download")
        assert {f.path: (f.size, f.sha256) for f in pin.files} == {
            "config.json": (len(FIRST["config.json"]), None),  # the Hub gives SHA-256s for LFS files only
            "model.safetensors": (1 << 20, hub._entry("model.safetensors")["lfs"]["oid"])}
        later = hub.push(LATER)  # the repository changes upstream
        hub.requests.clear()
        again = DownloadJob(REPO, cache_dir=catalogue, endpoint=hub.endpoint).run()
        asked = _asked(hub)
    assert later != COMMIT and first.name == again.name == COMMIT
    assert (again / "model.safetensors").read_bytes() == FIRST["model.safetensors"]
    assert f"/api/models/{REPO}/revision/{COMMIT}" in asked and not any("/revision/main" in p for p in asked)
    assert all(f"/resolve/{COMMIT}/" in p for p in asked if "/resolve/" in p)
    assert cached_snapshot(REPO, cache_dir=catalogue) == first
    assert pin_status(REPO) == f"pinned at first download: {COMMIT[:7]}"


def test_a_resume_after_a_cancel_fetches_the_commit_the_first_try_pinned(catalogue):
    with HubServer(REPO, FIRST) as hub:
        job = DownloadJob(REPO, cache_dir=catalogue, endpoint=hub.endpoint,
                          on_progress=lambda p: job.cancel() if p.file == "model.safetensors" else None)
        with pytest.raises(DownloadCancelled):
            job.run()
        assert hub_lock.locked(REPO).sha == COMMIT  # pinned before the first file was fetched
        assert cached_snapshot(REPO, cache_dir=catalogue) is None  # the half-filled folder is not a model to serve
        hub.push(LATER)
        folder = DownloadJob(REPO, cache_dir=catalogue, endpoint=hub.endpoint).run()
    assert folder.name == COMMIT
    assert {name: (folder / name).read_bytes() for name in FIRST} == FIRST


def test_the_offline_lookup_follows_the_lock_not_the_branch_ref(catalogue):
    with HubServer(REPO, FIRST) as hub:
        pinned = DownloadJob(REPO, cache_dir=catalogue, endpoint=hub.endpoint).run()
        later = hub.push(LATER)
        # A caller's own revision is its own: this writes refs/main -> the new commit, as snapshot_download does.
        newer = DownloadJob(REPO, revision="main", cache_dir=catalogue, endpoint=hub.endpoint).run()
    assert newer.name == later and (catalogue / f"models--{REPO.replace('/', '--')}" / "refs" / "main").read_text() \
        == later
    assert cached_snapshot(REPO, cache_dir=catalogue) == pinned  # what this machine runs is still the first commit
    assert cached_snapshot(REPO, cache_dir=catalogue, revision="main") == newer


def test_a_snapshot_cached_before_the_lock_existed_is_pinned_as_found(catalogue):
    with HubServer(REPO, FIRST) as hub:
        found = DownloadJob(REPO, revision="main", cache_dir=catalogue, endpoint=hub.endpoint).run()
        assert hub_lock.locked(REPO) is None  # a caller's own revision pins nothing
        assert cached_snapshot(REPO, cache_dir=catalogue) == found
        pin = hub_lock.locked(REPO)
        assert (pin.sha, pin.how, pin.files) == (COMMIT, "cache", ())
        hub.push(LATER)
        folder = DownloadJob(REPO, cache_dir=catalogue, endpoint=hub.endpoint).run()
    assert folder == found and (folder / "config.json").read_bytes() == FIRST["config.json"]
    assert {f.path for f in hub_lock.locked(REPO).files} == set(FIRST)  # the first listing fills the files in


def test_a_hub_answering_other_files_at_the_locked_commit_is_refused(catalogue):
    with HubServer(REPO, FIRST) as hub:
        DownloadJob(REPO, cache_dir=catalogue, endpoint=hub.endpoint).run()
        hub.history[COMMIT] = hub.files = {**FIRST, "model.safetensors": os.urandom(1 << 20)}
        with pytest.raises(RevisionLockMismatch, match="model.safetensors"):
            DownloadJob(REPO, cache_dir=catalogue, endpoint=hub.endpoint).run()


@pytest.mark.parametrize("damage", ["{not json", json.dumps({"version": 1, "repos": {REPO: {"sha": "main"}}}),
                                    json.dumps({"version": 99, "repos": {}}), json.dumps([1, 2])])
def test_a_damaged_lock_file_is_refused_never_ignored(catalogue, own_lock, damage):
    own_lock.parent.mkdir(parents=True, exist_ok=True)
    own_lock.write_text(damage)
    with HubServer(REPO, FIRST) as hub:
        with pytest.raises(DamagedRevisionLock, match="delete it to pin each model again") as error:
            DownloadJob(REPO, cache_dir=catalogue, endpoint=hub.endpoint).run()
        assert not any("/resolve/" in p for p in _asked(hub))  # nothing fetched
    assert str(own_lock) in str(error.value)
    with pytest.raises(DamagedRevisionLock):
        cached_snapshot(REPO, cache_dir=catalogue)
    assert pin_status(REPO).startswith("lock file damaged, downloads refused")
    assert pin_status(PINNED) == f"pinned to {PINNED_SHA[:7]}"  # the catalogue's own pin needs no lock file
    assert own_lock.read_text() == damage  # never written over


def test_a_failed_write_keeps_the_old_lock_whole(catalogue, own_lock, monkeypatch):
    hub_lock.record(hub_lock.new_pin("a/b", COMMIT, "main", "download"))
    before = own_lock.read_bytes()

    def power_cut(*args):
        raise OSError("disk gone")

    monkeypatch.setattr(hub_lock.os, "replace", power_cut)
    with pytest.raises(OSError, match="disk gone"):
        hub_lock.record(hub_lock.new_pin("c/d", COMMIT, "main", "download"))
    assert own_lock.read_bytes() == before
    writers = own_lock.name + hub_lock.WRITING_SUFFIX  # the writers' lock (kept on POSIX)
    assert [p.name for p in own_lock.parent.iterdir() if p.name != writers] == [own_lock.name]  # no temporary file


def test_the_owner_update_moves_the_pin_to_mains_latest_commit(catalogue):
    assert pin_status(REPO) == UNPINNED
    with HubServer(REPO, FIRST) as hub:
        DownloadJob(REPO, cache_dir=catalogue, endpoint=hub.endpoint).run()
        later = hub.push(LATER)
        old, new = update_pin(REPO, endpoint=hub.endpoint)
        assert (old.sha, new.sha, new.how) == (COMMIT, later, "update")
        assert cached_snapshot(REPO, cache_dir=catalogue) is None  # the new commit is not downloaded yet
        folder = DownloadJob(REPO, cache_dir=catalogue, endpoint=hub.endpoint).run()
    assert folder.name == later and (folder / "config.json").read_bytes() == LATER["config.json"]
    assert pin_status(REPO) == f"pinned by the owner's update: {later[:7]}"
    with pytest.raises(ModelSourceError, match="pinned by the catalogue"):
        update_pin(PINNED, endpoint=hub.endpoint)
