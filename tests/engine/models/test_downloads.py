"""Hub downloads against a local server speaking the Hub's file API: progress, resume, cancel, corruption, gates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.models.downloads import DownloadJob, cached_snapshot
from engine.errors import CorruptDownload, DownloadCancelled, GatedModelError
from hub_server import HubServer

REPO = "studio-tests/tiny-llama"
pytestmark = pytest.mark.usefixtures("own_lock")  # each test pins its repository afresh


@pytest.fixture(scope="module")
def tiny_model_files(tmp_path_factory) -> dict[str, bytes]:
    """A real (random) tiny Llama saved by transformers: config + one safetensors file of ~17 MiB, more than
    huggingface_hub's 10 MiB read chunk, so a broken connection leaves part of the file to resume from."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=16384, tie_word_embeddings=False)
    folder = tmp_path_factory.mktemp("tiny")
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert len(files["model.safetensors"]) > 12 << 20
    return {**files, "README.md": b"# not a model file\n"}


def test_download_reports_progress_resumes_a_broken_connection_and_loads(tiny_model_files, tmp_path):
    seen = []
    with HubServer(REPO, tiny_model_files) as hub:
        hub.drop_after["model.safetensors"] = 12 << 20  # the connection breaks 12 MiB in
        folder = DownloadJob(REPO, cache_dir=tmp_path, endpoint=hub.endpoint, on_progress=seen.append).run()
        ranges = hub.gets("model.safetensors")
    assert ranges[0] is None and ranges[1].startswith("bytes=") and int(ranges[1][6:].rstrip("-")) > 0
    assert (folder / "model.safetensors").read_bytes() == tiny_model_files["model.safetensors"]
    assert not (folder / "README.md").exists()  # only what a model needs
    total = sum(len(v) for k, v in tiny_model_files.items() if k != "README.md")
    assert seen[-1].done_bytes == seen[-1].total_bytes == total and seen[-1].files_done == seen[-1].files_total
    assert len(seen) > 3 and all(a.done_bytes <= b.done_bytes for a, b in zip(seen, seen[1:]))
    assert folder.parts[-3] == "models--studio-tests--tiny-llama"  # the standard cache layout
    assert cached_snapshot(REPO, tmp_path) == folder  # found again offline, as the picker's "Serve" does
    assert cached_snapshot("studio-tests/never-downloaded", tmp_path) is None
    from engine.models.loader import load_model

    model, _ = load_model(str(folder), device="cpu", dtype="float32", with_tokenizer=False)
    assert model.config.vocab_size == 16384


def test_a_killed_download_resumes_without_fetching_finished_files_again(tiny_model_files, tmp_path):
    files = {"config.json": tiny_model_files["config.json"],
             "model-00001-of-00002.safetensors": os.urandom(1 << 20),
             "model-00002-of-00002.safetensors": os.urandom(4 << 20)}
    script = textwrap.dedent(f"""
        import sys
        from engine.models.downloads import DownloadJob
        DownloadJob({REPO!r}, cache_dir=sys.argv[1]).run()
    """)
    with HubServer(REPO, files) as hub:
        hub.rate = 1 << 20  # 1 MiB/s: the second shard takes seconds, time to kill the process within it
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "PYTHONPATH": str(Path(__file__).parents[3])}
        process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], env=env)
        deadline = time.monotonic() + 300
        while not hub.gets("model-00002-of-00002.safetensors") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert hub.gets("model-00002-of-00002.safetensors"), "the download never reached the second shard"
        hub.rate = None
        folder = DownloadJob(REPO, cache_dir=tmp_path, endpoint=hub.endpoint).run()
        assert len(hub.gets("model-00001-of-00002.safetensors")) == 1  # kept from the killed run
        assert len(hub.gets("model-00002-of-00002.safetensors")) == 2
    for name, data in files.items():
        assert (folder / name).read_bytes() == data


def test_cancel_stops_between_reads_and_keeps_no_partial_file(tiny_model_files, tmp_path):
    # huggingface_hub reads 10 MiB at a time: cancel lands at the first read boundary (0.2 s at 50 MB/s)
    files = {"config.json": b"{}", "model.safetensors": os.urandom(24 << 20)}
    with HubServer(REPO, files) as hub:
        # The file takes 12 s; the first 10 MiB read ends at 5 s: 7 s of margin for a loaded CI machine (the 6 s
        # file with a 4.5 s bound failed there).
        hub.rate = 2 << 20
        job = DownloadJob(REPO, cache_dir=tmp_path, endpoint=hub.endpoint,
                          on_progress=lambda p: job.cancel() if p.file == "model.safetensors" else None)
        started = time.monotonic()
        with pytest.raises(DownloadCancelled, match="download cancelled during model.safetensors"):
            job.run()
        assert time.monotonic() - started < 9.5  # well before the 12 s the whole file takes
    snapshot = next(tmp_path.glob("models--*/snapshots/*"))
    assert not (snapshot / "model.safetensors").exists()
    assert not list(tmp_path.glob("models--*/blobs/*.incomplete"))


def test_a_corrupt_file_is_detected_and_removed(tiny_model_files, tmp_path):
    files = {"config.json": b"{}", "model.safetensors": os.urandom(1 << 20)}
    with HubServer(REPO, files) as hub:
        hub.corrupt.add("model.safetensors")
        with pytest.raises(CorruptDownload, match="model.safetensors is corrupt"):
            DownloadJob(REPO, cache_dir=tmp_path, endpoint=hub.endpoint).run()
        hub.corrupt.clear()
        folder = DownloadJob(REPO, cache_dir=tmp_path, endpoint=hub.endpoint).run()  # fetched again, whole
    assert (folder / "model.safetensors").read_bytes() == files["model.safetensors"]


def test_a_gated_model_says_how_to_log_in(tmp_path):
    with HubServer(REPO, {"config.json": b"{}"}) as hub:
        hub.gated = True
        with pytest.raises(GatedModelError, match="hf auth login") as error:
            DownloadJob(REPO, cache_dir=tmp_path, endpoint=hub.endpoint).run()
    assert "accept its license" in str(error.value)
