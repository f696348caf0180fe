"""The studio on the embedded SmolLM2, served in-process on a free port: what every browser test starts."""

from __future__ import annotations

from contextlib import contextmanager

from ports import free_port


def slow_session(read_seconds: float, token_seconds: float | None = None):
    """A ``DocumentSession`` class whose forwards sleep first: ``read_seconds`` per chunk read, ``token_seconds``
    per one-token (decode) forward (default: the same), so a test can act while a read or an answer runs. The
    sleep dominates a step, so the rates (and the estimates made from them) are steady."""
    import time

    from engine import DocumentSession

    per_token = read_seconds if token_seconds is None else token_seconds

    class SlowSession(DocumentSession):
        def _forward(self, ids, *args, **kwargs):
            time.sleep(per_token if len(ids) == 1 else read_seconds)
            return super()._forward(ids, *args, **kwargs)

    return SlowSession


def tab(browser, url: str, timeout_ms: int, *, height: int = 900):
    """A new tab of its own (a fresh context: no shared storage, so a tab's memory of its document stays its own)
    at ``url``, 1280 x ``height``."""
    page = browser.new_context(viewport={"width": 1280, "height": height}).new_page()
    page.set_default_timeout(timeout_ms)
    page.goto(url)
    return page


def read_and_ask(page, pdf, question: str) -> None:
    """Drops ``pdf`` on the page, reads it once it fits, and asks ``question``."""
    page.locator("#file-drop input[type=file]").set_input_files(str(pdf))
    page.wait_for_selector("#plan .plan[data-fits=true]")
    page.click("#read")
    page.wait_for_selector("#prefill-progress .progress[data-state=done]")
    page.fill("#question textarea", question)
    page.click("#ask")


@contextmanager
def served(session_class=None, *, chunk_size: int, max_upload: int | None = None, port: int | None = None,
           **build_options):
    """Yields the URL of the studio whose tabs get ``session_class`` sessions (default ``DocumentSession``);
    ``build_options`` go to ``build_ui`` (e.g. ``snapshot_store``), ``max_upload`` to the launch as ``launch.py``'s;
    ``port``: the port to serve on (a restart on the same one keeps the tabs' storage), else a free one."""
    from app.ui import build_ui, launch_options
    from engine import DocumentSession, OffloadPolicy
    from engine.models.loader import describe, load_model

    model, tokenizer = load_model(None)
    session_class = session_class or DocumentSession
    policy = OffloadPolicy(chunk_size=chunk_size)
    demo = build_ui(lambda: session_class(model, tokenizer, policy), model_info=describe(model), **build_options)
    port = port or free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                max_file_size=max_upload, **launch_options(max_upload))
    try:
        yield demo.local_url
    finally:
        demo.close()
