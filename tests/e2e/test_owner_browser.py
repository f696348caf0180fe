"""The model picker is the owner's, in a real Chromium, on the studio as ``launch.py --share`` starts it where the share
server cannot be reached (served locally, visitors kept apart): a visitor's page says whose the picker is, lists the
catalogue alone and is refused a folder scan, a download and a switch; a wrong owner key changes nothing; the owner link
printed on the console gives its browser an HttpOnly cookie, leaves the address bar, and lists a server folder.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from picker_page import PICKER_TIMEOUT_MS, ROWS_JS, wait_text
from studio import tab

from app.browser_id import COOKIE as BROWSER_COOKIE
from app.owner import COOKIE as OWNER_COOKIE

ROOT = Path(__file__).resolve().parents[2]
START_SECONDS = 600  # a first start builds the kernels and converts the embedded model: minutes on a busy 2-core box
pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TINY_CONFIG = ('{"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, '
               '"intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 2048}')
# launch.main as ``python launch.py`` runs it, but told the share server is unreachable: the offline --share path,
# private as under a tunnel, without opening one to the internet from a test.
OFFLINE_SHARE = "import sys, launch; launch.can_reach_share_server = lambda timeout=3.0: False; launch.main(sys.argv[1:])"


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    from engine.models.loader import _embedded_gguf, embedded_model_dir
    from engine.paths import cache_dir

    embedded_model_dir()  # converted here, once per cache, not within the studio's start deadline
    root = tmp_path_factory.mktemp("owner")
    models = root / "server-models"  # a folder of the server's, outside the app: a config and a .gguf
    (models / "tiny-random-llama").mkdir(parents=True)
    (models / "tiny-random-llama" / "config.json").write_text(TINY_CONFIG)
    (models / "smollm2-server.gguf").symlink_to(_embedded_gguf())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HOME": str(root / "home"), "HEADINFER_CACHE": str(cache_dir()),
           "HEADINFER_CPU_MODEL": "embedded", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    log_path = root / "studio.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "-c", OFFLINE_SHARE, "--share", "--port", str(port),
                                    "--no-kv-cache"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + START_SECONDS
        while not (found := re.search(r"open (http://\S+/\?owner=[\w-]+)", log_path.read_text())):
            assert process.poll() is None, f"the studio exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no owner link logged:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.5)
        yield {"url": url, "owner_link": found.group(1), "models": models, "log": log_path}
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _where(page) -> list[str]:
    """The "Where" column of every row of the picker's table."""
    return [row[14] for row in page.evaluate(ROWS_JS) if row and len(row) > 14]


def _scan(page, folder: Path) -> None:
    page.fill("#picker-folder textarea, #picker-folder input", str(folder))
    page.click("#picker-scan")


def _owner_cookies(page) -> list[dict]:
    """The owner's cookie, if this browser holds one; every browser also gets its shelf's id (app/browser_id.py)."""
    cookies = page.context.cookies()
    assert {c["name"] for c in cookies} <= {OWNER_COOKIE, BROWSER_COOKIE}, cookies
    return [c for c in cookies if c["name"] == OWNER_COOKIE]


def test_a_visitor_is_refused_the_picker_and_the_owner_link_opens_it(studio, browser):
    assert studio["owner_link"] not in _page_html(studio["url"])  # the key is on the console only

    visitor = tab(browser, studio["url"], PICKER_TIMEOUT_MS)
    visitor.click("#picker .label-wrap")
    wait_text(visitor, "#picker-owner-note", "owner link printed in the console")
    wait_text(visitor, "#picker-table", "Qwen/Qwen2.5-7B-Instruct-1M")  # the catalogue stays listed
    _scan(visitor, studio["models"])
    wait_text(visitor, "#picker-machine", "Not scanned", "owner link printed in the console")
    assert "tiny-random-llama" not in visitor.inner_text("#picker-table")
    where = _where(visitor)
    assert where and not any(str(studio["models"].parent) in w or w.startswith(("folder", "Ollama", "LM Studio",
                                                                                "Hugging Face cache")) for w in where)
    visitor.click("#picker-serve")
    wait_text(visitor, "#picker-status", "owner link printed in the console")
    visitor.click("#picker-download")  # the same refusal: the page shows no change, the console says it
    _until_logged(studio["log"], "a visitor's download was refused")
    assert _owner_cookies(visitor) == []

    stranger = tab(browser, studio["url"] + "?owner=not-the-key", PICKER_TIMEOUT_MS)
    stranger.wait_for_selector("#picker")
    assert _owner_cookies(stranger) == []  # a wrong key is any visitor

    owner = tab(browser, studio["owner_link"], PICKER_TIMEOUT_MS)
    owner.wait_for_selector("#picker")
    assert "owner=" not in owner.url  # redirected: the key leaves the address bar and the history
    [cookie] = _owner_cookies(owner)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and studio["owner_link"].split("=")[-1] not in \
        cookie["value"]
    owner.click("#picker .label-wrap")
    wait_text(owner, "#picker-table", "Qwen/Qwen2.5-7B-Instruct-1M")
    _scan(owner, studio["models"])
    wait_text(owner, "#picker-table", "tiny-random-llama")
    assert f"folder: {studio['models'] / 'tiny-random-llama'}" in _where(owner)
    assert any(w.startswith("folder: ") and w.endswith("smollm2-server.gguf") for w in _where(owner))
    assert "Not scanned" not in owner.inner_text("#picker-machine")
    log = studio["log"].read_text()
    assert "a visitor's folder scan was refused" in log and "a visitor's switch of the served model was refused" in log
    assert "owner link with a wrong key" in log and "the owner link was opened" in log


def _until_logged(log: Path, text: str) -> None:
    deadline = time.monotonic() + PICKER_TIMEOUT_MS / 1000
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"not logged: {text}"
        time.sleep(0.5)


def _page_html(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()
