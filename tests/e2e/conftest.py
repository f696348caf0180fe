"""The studio served in-process on a free port with the embedded SmolLM2, for browser tests."""

import socket

import pytest


@pytest.fixture(scope="session")
def studio_url():
    from app.ui import build_ui, launch_options
    from engine import DocumentSession, OffloadPolicy
    from engine.loader import describe, load_model

    model, tokenizer = load_model(None)
    # Small chunks so the progress bar visibly moves on a short document.
    policy = OffloadPolicy(chunk_size=16)
    demo = build_ui(lambda: DocumentSession(model, tokenizer, policy), model_info=describe(model))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch_options())
    yield demo.local_url
    demo.close()
