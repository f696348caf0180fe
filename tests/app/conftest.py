"""Fixtures for the app tests: the embedded SmolLM2 with the head-wise attention, loaded once,
and a short PDF with a fact hidden on its last page."""

import pytest
from make_files import make_pdf

SECRET_PAGES = (
    "The lighthouse stands on a rocky cape. Its keeper, Mara, has tended it for twenty years.",
    "Storms come in autumn. Ships avoid the northern reef thanks to the light.",
    "The secret launch code of the lighthouse is AMBER-7. Only Mara knows it.",
)


@pytest.fixture(scope="session")
def embedded_model():
    """``(model, tokenizer)``: the embedded SmolLM2-135M as the app runs it (CPU here)."""
    from engine.models.loader import load_model

    return load_model(None, weights="dense")


@pytest.fixture
def secret_pdf(tmp_path):
    """A 3-page PDF (~80 tokens of text) whose page 3 holds the launch code AMBER-7."""
    return str(make_pdf(tmp_path / "lighthouse.pdf", SECRET_PAGES))


@pytest.fixture(scope="session")
def real_documents(request, tmp_path_factory):
    """``key -> path`` of real manuals from Debian packages (benchmarks.corpus), cached in pytest's cache."""
    from benchmarks.corpus import CorpusUnavailable, fetch_corpus

    cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    folder = cache.mkdir("debian-documents") if cache else tmp_path_factory.mktemp("debian-documents")
    try:
        return fetch_corpus(folder)
    except CorpusUnavailable as exc:
        pytest.skip(f"real documents unavailable: {exc}")
