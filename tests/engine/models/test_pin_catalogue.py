"""``python -m engine.models.pin_catalogue`` fills each 'main' in catalogue.json with the commit the Hub names for it,
keeping the file's layout; the Hub is a stand-in ``HfApi`` passed in (this machine cannot reach the real one)."""

from __future__ import annotations

import hashlib
import json
import re
from types import SimpleNamespace

import pytest

from engine.errors import ModelSourceError
from engine.models.downloads import CATALOGUE
from engine.models.pin_catalogue import pin_catalogue


class FakeHub:
    """``HfApi.model_info`` as the tool calls it: a commit per repository (or ``answer`` for all), calls recorded."""

    def __init__(self, answer: str | None = None):
        self.asked: list[tuple[str, str]] = []
        self.answer = answer

    def model_info(self, repo_id, revision=None):
        self.asked.append((repo_id, revision))
        return SimpleNamespace(sha=self.answer or hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest())


def test_every_main_in_the_catalogue_gets_its_commit_and_nothing_else_changes(tmp_path):
    path = tmp_path / "catalogue.json"
    path.write_text(CATALOGUE.read_text())
    before = json.loads(path.read_text())["models"]
    hub = FakeHub()
    pinned = pin_catalogue(path, api=hub)
    after = json.loads(path.read_text())["models"]
    branches = [m["id"] for m in before if m["revision"] == "main" and not m.get("pypi")]
    assert len(branches) >= 1 and sorted(pinned) == sorted(branches) and [r for r, _ in hub.asked] == branches
    assert all(rev == "main" for _, rev in hub.asked)
    for old, new in zip(before, after):
        expected = pinned.get(old["id"], old["revision"])
        assert new == {**old, "revision": expected} and re.fullmatch("[0-9a-f]{40}", new["revision"])
    # only the revision values changed: the hand-kept layout (line breaks, spacing) stays
    assert len(path.read_text().splitlines()) == len(CATALOGUE.read_text().splitlines())
    assert pin_catalogue(path, api=FakeHub()) == {}  # pinned already: the Hub is not asked again


def test_an_answer_that_is_not_a_commit_leaves_the_file_unchanged(tmp_path):
    path = tmp_path / "catalogue.json"
    path.write_text(CATALOGUE.read_text())
    with pytest.raises(ModelSourceError, match="not a commit hash"):
        pin_catalogue(path, api=FakeHub(answer="main"))
    assert path.read_text() == CATALOGUE.read_text()
