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


@pytest.fixture(scope="module")
def share_url(embedded_model):
    """The studio's URL, served on loopback as ``launch.py --share`` would be (the share name allowed)."""
    from ports import free_port

    from app.hosts import AllowedHosts
    from app.ui import build_ui, launch_options
    from engine import DocumentSession, OffloadPolicy
    from engine.models.loader import describe

    model, tokenizer = embedded_model
    demo = build_ui(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=32)),
                    model_info=describe(model))
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                **launch_options(1 << 20, hosts=AllowedHosts.for_launch("127.0.0.1", share=True)))
    yield demo.local_url.rstrip("/")
    demo.close()


@pytest.fixture(scope="module")
def backend_served():
    """``(url, demo, backend)``: the ``--backend`` page on a port as ``launch.py --backend --share`` serves it
    (``launch_options``), over the in-process ``SimulatedBackend``."""
    import httpx
    from ports import free_port
    from simulated_backend import SimulatedBackend

    from app.backend_client import BackendClient
    from app.backend_page import build_backend_ui
    from app.hosts import AllowedHosts
    from app.ui import launch_options

    backend = SimulatedBackend()
    client = BackendClient("http://gpu-box:8000", transport=httpx.MockTransport(backend))
    demo = build_backend_ui(client, client.models(), url="http://gpu-box:8000")
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                **launch_options(1 << 20, hosts=AllowedHosts.for_launch("127.0.0.1", share=True)))
    yield demo.local_url.rstrip("/"), demo, backend
    demo.close()
