"""launch.py's start-up lines: ours, not Gradio's. Its "To create a public link, set `share=True` in `launch()`" named a
Python argument where our flag is --share (issue 51, finding 10). ``app.startup.serve`` is the path ``launch.main`` serves
through, run here on a small page of its own."""

from __future__ import annotations

import logging
import urllib.request

import gradio as gr
from ports import free_port

from app import cli, startup


def test_the_console_says_where_it_serves_and_to_add_share_not_gradios_share_true(capfd, caplog):
    port = free_port()
    with gr.Blocks() as demo:
        gr.Markdown("A page")
    caplog.set_level(logging.INFO, logger="headinfer.launch")
    startup.serve(demo, cli.build_parser().parse_args(["--port", str(port)]), False)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as response:
            assert response.status == 200
    finally:
        demo.close()
    printed = capfd.readouterr()
    assert "share=True" not in printed.out + printed.err and "To create a public link" not in printed.out, printed
    assert f"serving at http://127.0.0.1:{port}/ (add --share for a public link)" in caplog.text, caplog.text
