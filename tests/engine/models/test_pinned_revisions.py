"""A catalogue model downloads the Hub commit the catalogue pins (``revision`` in catalogue.json), not whatever its
branch holds on the day: the revision reaches huggingface_hub's calls, and the offline lookup finds that commit."""

from __future__ import annotations

import json
import re

import pytest

from engine.models import downloads
from engine.models.catalogue import load_catalogue
from engine.models.downloads import DownloadJob, cached_snapshot, pinned_revision
from hub_server import COMMIT, HubServer

REPO = "studio-tests/pinned-model"
FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\0" * 4096}
pytestmark = pytest.mark.usefixtures("own_lock")  # each test pins its repository afresh


@pytest.fixture
def pinned(tmp_path, monkeypatch):
    catalogue = tmp_path / "catalogue.json"
    catalogue.write_text(json.dumps({"models": [{"id": REPO, "revision": COMMIT}]}))
    monkeypatch.setattr(downloads, "CATALOGUE", catalogue)
    return tmp_path / "hub-cache"


def test_a_download_asks_the_hub_for_the_pinned_commit(pinned):
    with HubServer(REPO, FILES) as hub:
        folder = DownloadJob(REPO, cache_dir=pinned, endpoint=hub.endpoint).run()
        paths = [path for _, path, _ in hub.requests]
    assert f"/api/models/{REPO}/revision/{COMMIT}" in paths
    assert not any(path == f"/api/models/{REPO}" or "/revision/main" in path for path in paths)
    resolved = [path for path in paths if "/resolve/" in path]
    assert resolved and all(f"/resolve/{COMMIT}/" in path for path in resolved)
    assert folder.name == COMMIT
    assert cached_snapshot(REPO, cache_dir=pinned) == folder  # found offline by its commit, with no ref written


def test_the_revision_reaches_huggingface_hub(pinned, monkeypatch):
    import huggingface_hub

    asked = []

    class Api:
        def __init__(self, **kwargs):
            pass

        def model_info(self, repo_id, revision=None):
            asked.append(("model_info", revision))
            return type("Info", (), {"sha": COMMIT})()

        def list_repo_tree(self, repo_id, revision=None, recursive=False):
            asked.append(("list_repo_tree", revision))
            return []

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    with pytest.raises(Exception, match="no model files"):
        DownloadJob(REPO, cache_dir=pinned).run()
    assert asked == [("model_info", COMMIT), ("list_repo_tree", COMMIT)]
    assert DownloadJob(REPO, revision="v2").revision == "v2"  # a caller's own revision still wins
    assert DownloadJob("someone/not-in-the-catalogue").revision is None


def test_every_catalogue_entry_names_its_revision():
    entries = load_catalogue()
    assert entries and all(entry.revision for entry in entries)
    assert all(re.fullmatch("[0-9a-f]{40}", e.revision) or e.revision == "main" for e in entries)
    assert {pinned_revision(e.id) for e in entries} == {e.revision for e in entries}
    assert sum(bool(re.fullmatch("[0-9a-f]{40}", e.revision)) for e in entries) >= 7
