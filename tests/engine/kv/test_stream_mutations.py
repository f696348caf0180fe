"""Every wait of the KV core matters: removing any one is caught on emulated streams (race, wrong answer or error).

The table of what catches each: docs/streams-mutations.md (``python tests/engine/helpers/stream_mutations.py``).
"""

from __future__ import annotations

import pytest

from engine.errors import RaceError

from archs import build_pair
from stream_mutations import FAMILIES, MODULES, UNCAUGHT, catches, mutated, sites
from streams_grid import CASES, run

SITES = sites()
CHECKED = [s for s in SITES if s.key not in UNCAUGHT]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return {name: build_pair(name, tmp_path_factory.mktemp(name)) for name in FAMILIES}


def test_every_module_of_the_transfer_layer_has_its_waits_found():
    assert {site.module for site in SITES} == set(MODULES)
    assert len(SITES) >= 30
    # Every documented exception still names a statement of the code (a stale entry would hide a new site).
    assert set(UNCAUGHT) <= {s.key for s in SITES}
    assert len(CHECKED) == len(SITES) - len(UNCAUGHT)


def test_a_mutation_is_undone_afterwards(pairs):
    """The harness itself: inside ``mutated`` the live code changes, outside it is the original again."""
    site = next(s for s in SITES if s.code.startswith("streams.current().wait_event(buffer.ready)"))
    stock, headinfer = pairs["llama-gqa"]
    with mutated(site), pytest.raises(RaceError, match="ping-pong buffer"):
        # The compute stream writes this token after the fetched past (or reads the buffer) while its fetch may
        # still be writing it.
        run(stock, headinfer, CASES[0])
    assert run(stock, headinfer, CASES[0]).races == []


@pytest.mark.parametrize("site", CHECKED, ids=[f"{s.module.split('.')[-1]}:{s.line}:{s.code[:40]}" for s in CHECKED])
def test_removing_a_wait_is_caught(site, pairs, monkeypatch):
    monkeypatch.setenv("HEADINFER_STREAMS_SEED", "0")
    caught = catches(site, pairs, CASES)
    assert caught, f"nothing catches removing `{site.code}` ({site.module}:{site.line}, in {site.function})"
