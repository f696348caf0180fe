"""An upload's visitor is a login only when Gradio knows its cookie (``app.upload_budget.visitor_of``): on a real
port, a made-up ``access-token-*`` cookie no longer buys a fresh upload budget (before, one per upload: the per-visitor
budget was a cookie away), while a real login keeps a budget of its own beside its address's."""

from __future__ import annotations

import gradio as gr
import httpx
import pytest
from ports import free_port
from starlette.middleware import Middleware

from app.guard import RequestGuard
from app.hosts import AllowedHosts
from app.upload_budget import UploadBudget, UploadLimits

PER_VISITOR = 1000  # bytes a visitor may upload in the window


def _serve(tmp_path, auth=None) -> gr.Blocks:
    budget = UploadBudget(UploadLimits(per_client=PER_VISITOR, window=3600, total=1 << 30), folder=lambda: tmp_path)
    hosts = AllowedHosts.for_launch("127.0.0.1", share=True)
    with gr.Blocks() as demo:
        gr.File()
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, auth=auth,
                app_kwargs={"middleware": [Middleware(RequestGuard, hosts=hosts, budget=budget)]})
    return demo


def _upload(client: httpx.Client, size: int, cookie: str | None = None) -> int:
    headers = {"Cookie": cookie} if cookie else {}
    return client.post("/gradio_api/upload", files={"files": ("a.txt", b"x" * size)}, headers=headers).status_code


@pytest.fixture
def open_app(tmp_path):
    demo = _serve(tmp_path)
    yield demo.local_url.rstrip("/")
    demo.close()


@pytest.fixture
def login_app(tmp_path):
    demo = _serve(tmp_path, auth=[("ada", "ada-password"), ("bo", "bo-password")])
    yield demo.local_url.rstrip("/")
    demo.close()


def test_a_made_up_login_cookie_buys_no_fresh_budget(open_app):
    with httpx.Client(base_url=open_app, timeout=30) as client:
        assert _upload(client, 600) == 200
        assert _upload(client, 600) == 429
        for number in range(3):  # before: 200 each time, a budget a cookie
            assert _upload(client, 600, f"access-token-x{number}=made-up-{number}") == 429


def test_a_real_login_has_a_budget_of_its_own(login_app):
    with httpx.Client(base_url=login_app, timeout=30) as ada, httpx.Client(base_url=login_app, timeout=30) as bo:
        assert ada.post("/login", data={"username": "ada", "password": "ada-password"}).status_code == 200
        assert bo.post("/login", data={"username": "bo", "password": "bo-password"}).status_code == 200
        assert _upload(ada, 600) == 200 and _upload(ada, 600) == 429
        assert _upload(bo, 600) == 200  # the same address, another login
        assert _upload(ada, 600, "access-token-x=made-up") in (401, 429)  # Gradio's own check, or the budget
