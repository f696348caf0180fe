"""The model picker in a real Chromium, on the studio as ``launch.py`` starts it (the embedded SmolLM2): the panel
lists the catalogue with what each model reads here, sorts by it, finds models on disk (an Ollama store holding the
SmolLM2 GGUF, a folder the user adds holding a tiny random Llama), downloads a catalogue model from a local stand-in
for the Hub (``HF_ENDPOINT``) with progress, and serves another model and back: the header follows, and the tab whose
document the switch closed says so and reads it again with the new model.

The studio runs as a process of its own with ``HOME`` in a temporary folder, so the Ollama and LM Studio folders it
scans and the Hugging Face cache it downloads into are the test's; ``HEADINFER_CACHE`` keeps the converted embedded
model of the real cache.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from chromium import chromium_page
from hub_server import HubServer
from lighthouse import PAGES
from make_files import make_pdf
from model_stores import OllamaStore
from picker_page import PICKER_TIMEOUT_MS, ROWS_JS, wait_text

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HUB_REPO = "Qwen/Qwen3-4B"  # a catalogue model, not gated; the stand-in Hub serves a tiny one under its name
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
FIRST_READS_JS = """(reads) => document.querySelector('#picker-table [role=row][data-index="0"] [data-col="1"]')
  ?.innerText.trim() === reads"""


def _tiny_llama(folder: Path, tokenizer_from: Path, vocab_size: int) -> Path:
    """A random two-layer Llama saved by transformers, with SmolLM2's tokenizer so the studio can serve it."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=4096,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for file in tokenizer_from.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, folder / file.name)
    return folder


def _pinned(repo: str) -> str:
    from engine.models.catalogue import load_catalogue

    return next(entry.revision for entry in load_catalogue() if entry.id == repo)


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    from engine.models.loader import _embedded_gguf, embedded_model_dir
    from engine.paths import cache_dir

    root = tmp_path_factory.mktemp("picker")
    home = root / "home"
    OllamaStore(home / ".ollama" / "models").pull("smollm2:135m", _embedded_gguf())
    tiny = _tiny_llama(root / "my-models" / "tiny-random-llama", embedded_model_dir(), 49152)
    hub_model = _tiny_llama(root / "hub-model", embedded_model_dir(), 2048)
    files = {p.name: p.read_bytes() for p in hub_model.iterdir() if p.is_file()}
    # 12 MiB more: huggingface_hub reads 10 MiB at a time, and a cancel lands at the end of such a read.
    files["model.safetensors"] += b"\0" * (12 << 20)
    with HubServer(HUB_REPO, files) as hub:
        hub.history[_pinned(HUB_REPO)] = files  # the catalogue pins the commit a download fetches: served there too
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {**os.environ, "HOME": str(home), "HEADINFER_CACHE": str(cache_dir()), "HEADINFER_CPU_MODEL": "embedded",
               "HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(home / ".cache" / "huggingface" / "hub"),
               "HF_HUB_OFFLINE": "0", "PYTHONUNBUFFERED": "1"}
        env.pop("OLLAMA_MODELS", None)
        env.pop("HF_HOME", None)
        log = open(root / "studio.log", "w")
        process = subprocess.Popen([sys.executable, "launch.py", "--port", str(port), "--no-kv-cache"], cwd=ROOT,
                                   env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}/"
        try:
            _wait_until_up(url, process, root / "studio.log")
            yield {"url": url, "hub": hub, "home": home, "tiny": tiny, "log": root / "studio.log"}
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()


def _wait_until_up(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the studio exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the studio did not answer within 300 s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def page(studio):
    with chromium_page(studio["url"], height=900, timeout_ms=PICKER_TIMEOUT_MS) as page:
        yield page


def _rows(page) -> dict[str, list[str]]:
    return {row[0]: row for row in page.evaluate(ROWS_JS) if row and row[0]}


def _reads(page) -> list[int]:
    return [int(row[1].replace(",", "")) for row in page.evaluate(ROWS_JS)]


def _sort(page, direction: str) -> None:
    page.hover("#picker-table th[data-heading='1']")  # the column's menu button shows on hover
    page.click("#picker-table th[data-heading='1'] button.cell-menu-button")
    page.click(f"button:has-text('Sort {direction}')")


def _choose(page, label: str) -> None:
    page.fill("#picker-choice input", label)
    page.click(f"[role=option]:has-text('{label}')")


def _until(predicate) -> None:
    deadline = time.monotonic() + PICKER_TIMEOUT_MS / 1000
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def _read_a_document(page, tmp_path: Path) -> None:
    """This tab reads a short PDF with the model served now (what the panel counts in each model's tokens)."""
    page.locator("#file-drop input[type=file]").set_input_files(str(make_pdf(tmp_path / "kerrow.pdf", PAGES)))
    page.wait_for_selector("#plan .plan[data-fits=true]")
    page.click("#read")
    page.wait_for_selector("#prefill-progress .progress[data-state=done]")


def _open_panel(page) -> None:
    page.click("#picker .label-wrap")
    wait_text(page, "#picker-table", "Qwen/Qwen2.5-7B-Instruct-1M")


def _scan_folder(page, studio) -> None:
    """The folder the user adds, holding the tiny Llama, scanned; the table lists it once found."""
    page.fill("#picker-folder textarea, #picker-folder input", str(studio["tiny"].parent))
    page.click("#picker-scan")
    wait_text(page, "#picker-table", "tiny-random-llama")


def test_the_panel_lists_the_catalogue_and_the_models_on_disk(page):
    wait_text(page, "#header", "SmolLM2-135M-Instruct")
    _open_panel(page)
    assert "Reads here" in page.inner_text("#picker-machine")
    rows = _rows(page)
    assert {SMOLLM2, "Qwen/Qwen2.5-7B-Instruct-1M", "smollm2:135m"} <= set(rows)
    assert rows[SMOLLM2][1] == "8192" and rows[SMOLLM2][14] == "serving now"  # capped by its 8,192-token window
    ollama = rows["smollm2:135m"]
    assert ollama[1] == "8192" and ollama[14].startswith("Ollama: ") and "/blobs/sha256-" in ollama[14]


def test_the_panel_counts_the_tabs_documents_in_each_models_tokens(page, tmp_path):
    """Before any download: the served model's own count (the plan's), Llama 3's exactly through tiktoken, the
    others estimated with that tokenizer."""
    _read_a_document(page, tmp_path)
    _open_panel(page)
    assert "Your documents" in page.inner_text("#picker-machine")
    rows = _rows(page)
    served = int(rows[SMOLLM2][2].replace(",", ""))
    assert served > 0 and rows[SMOLLM2][3] == "all of them; counted by the model itself"
    llama3 = rows["meta-llama/Llama-3.1-8B-Instruct"]
    assert int(llama3[2].replace(",", "")) > 0 and llama3[3].endswith("; exact (Llama 3 tokenizer)")
    assert rows["Qwen/Qwen2.5-7B-Instruct-1M"][3].endswith("an estimate (Llama 3 tokenizer)")


def test_the_table_ranks_by_what_reads_here_and_sorts_both_ways(page):
    _open_panel(page)
    reads = _reads(page)
    assert reads == sorted(reads, reverse=True) and reads[0] > reads[-1]  # ranked by what reads the most here
    _sort(page, "ascending")
    page.wait_for_function(FIRST_READS_JS, arg=str(min(reads)))
    assert _reads(page) == sorted(reads)
    _sort(page, "descending")
    page.wait_for_function(FIRST_READS_JS, arg=str(max(reads)))
    assert _reads(page) == sorted(reads, reverse=True)


def test_a_folder_the_user_adds_lists_the_model_in_it(page, studio):
    _open_panel(page)
    _scan_folder(page, studio)
    _until(lambda: _rows(page).get("tiny-random-llama", [""] * 15)[14] == f"folder: {studio['tiny']}")


def test_a_hub_download_shows_progress_cancels_and_completes_into_the_standard_cache(page, studio):
    _open_panel(page)
    hub = studio["hub"]
    hub.rate = 1 << 20  # the first 10 MiB take 10 s: time to cancel
    _choose(page, HUB_REPO)
    page.click("#picker-download")
    wait_text(page, "#picker-status", f"Downloading {HUB_REPO}", "%")
    _until(lambda: hub.gets("model.safetensors"))  # cancel within the weights' file
    page.click("#picker-cancel")
    wait_text(page, "#picker-status", "download cancelled during model.safetensors")
    hub.rate = 16 << 20
    page.click("#picker-download")
    wait_text(page, "#picker-status", f"Downloaded {HUB_REPO}")
    snapshot = studio["home"] / ".cache" / "huggingface" / "hub" / "models--Qwen--Qwen3-4B" / "snapshots"
    assert len(list(snapshot.glob("*/model.safetensors"))) == 1
    assert hub.gets("model.safetensors") == [None, None]  # cancelled, then fetched whole
    wait_text(page, "#picker-table", "Hugging Face cache: ")  # the table lists it as on disk now


def test_serving_another_model_closes_the_tabs_documents_and_the_page_follows(page, studio, tmp_path):
    """The tiny Llama served: the header follows, the read document is closed with a note and reads again; then
    back to the embedded SmolLM2 from the catalogue."""
    wait_text(page, "#header", "SmolLM2-135M-Instruct")
    _read_a_document(page, tmp_path)
    _open_panel(page)
    _scan_folder(page, studio)
    _choose(page, "tiny-random-llama")
    page.click("#picker-serve")
    wait_text(page, "#picker-status", "Now serving tiny-random-llama", "1 open document set(s) closed")
    wait_text(page, "#header", "tiny-random-llama")
    assert "SmolLM2" not in page.inner_text("#header")
    wait_text(page, "#status", "switched from", "open documents were closed")
    assert page.get_attribute("#prefill-progress .progress", "data-state") == "idle"
    other = page.context.new_page()  # a tab opened now shows the model served now, not the one the page was built with
    other.goto(studio["url"])
    wait_text(other, "#header", "tiny-random-llama")
    other.close()
    page.click("#read")
    page.wait_for_selector("#prefill-progress .progress[data-state=done]")
    _until(lambda: _rows(page).get("tiny-random-llama", [""] * 15)[14] == "serving now")  # the table follows too

    _choose(page, SMOLLM2)
    page.click("#picker-serve")
    wait_text(page, "#picker-status", "Now serving HuggingFaceTB/SmolLM2-135M-Instruct")
    wait_text(page, "#header", "SmolLM2-135M-Instruct")
    assert "tiny-random-llama" not in page.inner_text("#header")
