"""The page: layout and event wiring. ``build_ui`` builds it; nothing happens at import time.

Heavy events (reading documents, answering) take turns on the compute device in the handlers' own line
(``app.compute_queue``): a waiting visitor's status line shows their place and an estimated wait, and
Cancel, Stop or closing the tab leaves the line. Gradio lets many of them in at once (``"compute"``, up
to ``HEAVY_EVENTS``) so that they can wait there. Saving a read document to disk and reopening one from
there happen inside the read event, so they hold the turn too. New chat and Clear touch only the tab's own
session, after its own running work has stopped. Choosing files (reading and tokenizing them) has a slot
of its own, ``"ingest"``, so uploads take turns. Light events (cancel, stop, meters, listing and deleting
saved documents) run at once, even while a heavy one is busy.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from pathlib import Path

import gradio as gr
from starlette.middleware import Middleware

from app import render
from app.browser_state import BrowserState
from app.csp import ContentSecurityPolicy
from app.documents import SUPPORTED_SUFFIXES
from app.estimate_refresh import refreshed_plan
from app.handlers import Handlers
from app.render import status
from engine import DocumentSession, SnapshotStore

ASSETS = Path(__file__).resolve().parent.parent / "assets"
COMPUTE = "compute"
HEAVY_EVENTS = 32  # heavy events Gradio runs at once: one computes, the rest wait in app.compute_queue's line
METER_SECONDS = 1.0
_LIGHT = {"concurrency_limit": None, "show_progress": "hidden"}
_HEAVY = {"concurrency_id": COMPUTE, "concurrency_limit": HEAVY_EVENTS}
_OWN = {"concurrency_limit": None}  # new chat / clear: the tab's own session, once its own work has stopped
_UPLOAD_CHECK = (Path(__file__).resolve().parent / "upload_check.js").read_text(encoding="utf-8")


def launch_options(max_upload: int | None = None) -> dict:
    """Look-and-feel arguments for ``Blocks.launch`` (Gradio 6 takes theme and CSS there); ``max_upload``: the
    largest upload in bytes, checked in the page before a byte is sent (the status line says why, in MiB)."""
    # System fonts only: the app must look right offline, without a request to Google Fonts.
    theme = gr.themes.Soft(primary_hue="teal", neutral_hue="slate",
                           font=["system-ui", "Segoe UI", "Roboto", "Helvetica", "Arial", "sans-serif"],
                           font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"])
    return {"theme": theme, "css_paths": [ASSETS / "style.css"], "favicon_path": str(ASSETS / "logo.svg"),
            # No image, media or frame from elsewhere: answers are model-written Markdown (see app.csp).
            "app_kwargs": {"middleware": [Middleware(ContentSecurityPolicy)]},
            "head": "" if max_upload is None else f"<script>{_UPLOAD_CHECK.replace('MAX_UPLOAD_BYTES', str(max_upload))}</script>"}


def build_ui(engine_factory: Callable[[], DocumentSession], *, model_info: dict | Callable[[], dict],
             title: str = "HeadInfer Studio", snapshot_store: SnapshotStore | None = None, private: bool = False,
             session_shelves: Path | None = None, upload_dir: Path | None = None,
             picker: Callable[[gr.State], None] | None = None, max_question: int | None = None) -> gr.Blocks:
    """Builds the page; each browser tab gets its own session from ``engine_factory``.

    Args:
        engine_factory: returns a fresh ``DocumentSession`` (sharing one loaded model).
        model_info: ``engine.models.loader.describe(model)``, shown under the title; or a function returning the
            served model's (``ModelHolder.info``), whose ``serial`` changes when the picker switches models: every tab's
            header then follows, and a tab whose document the switch closed says so.
        title: page and header title.
        snapshot_store: where read documents' KV caches are saved and reopened from; None turns saving
            and reopening off (and hides their controls).
        private: others can reach the app, so visitors are kept apart: saved documents per logged-in
            user (under the store's ``users/`` folder), else per tab in ``session_shelves`` (deleted
            when the tab closes; without that folder such visitors save nothing).
        upload_dir: the folder Gradio keeps uploads in (``app.uploads.prepare_folder``); a tab's uploads
            are deleted when it closes. Set before any component exists, as Gradio reads it then.
        picker: adds the model picker below the page (``app.picker.ModelPicker.build``); None leaves it out.
        max_question: the longest question in tokens (None: what the plan leaves beside the document and answer).
    """
    if upload_dir is not None:
        os.environ["GRADIO_TEMP_DIR"] = str(upload_dir)  # Gradio's only setting for it
    handlers = Handlers(engine_factory, snapshot_store, private=private, session_shelves=session_shelves,
                        upload_dir=upload_dir, max_question=max_question)
    saving = snapshot_store is not None
    # analytics off: the studio makes no calls home (it is often run offline). delete_cache: uploads
    # older than a day go even from a tab left open (the tab's own are deleted when it closes).
    with gr.Blocks(title=title, fill_width=True, analytics_enabled=False, delete_cache=(3600, 86400)) as demo:
        # delete_callback: Gradio's own expiry of a session is the backstop to ``unload``.
        state = gr.State(BrowserState(), delete_callback=lambda s: s.close() if s else None)
        # The tab's saved document and conversation, mirrored into its sessionStorage (that tab's only, kept across
        # a reload) by _REMEMBER_JS and handed back on load by _RECALL_JS.
        tab_memory = gr.Textbox(visible=False, elem_id="tab-memory")
        with gr.Row(equal_height=True, elem_id="topbar"):
            current_info = model_info if callable(model_info) else lambda: model_info
            # A function as the value: computed at each page load, so a tab opened after a switch shows the new model.
            header = gr.HTML(lambda: _header(title, current_info()), elem_id="header", scale=2, min_width=340)
            meters = gr.HTML(label="Meters", elem_id="meters", scale=3, min_width=340)
        status_box = gr.HTML(status("info", "Drop a book or a stack of documents, read them once, then ask "
                                            "questions about the whole text."), label="Status", elem_id="status")
        with gr.Row(equal_height=False, elem_id="main"):
            with gr.Column(scale=5, min_width=340, elem_id="documents-column"):
                files = gr.File(label="Documents", file_count="multiple", file_types=list(SUPPORTED_SUFFIXES),
                                elem_id="file-drop", height=120)
                table = gr.HTML(render.files_table([], []), label="Files", elem_id="files-table")
                plan = gr.HTML(render.empty_plan(), label="Memory plan", elem_id="plan")
                with gr.Group(visible=False, elem_id="page-range") as range_box:
                    with gr.Row(equal_height=True):
                        range_from = gr.Dropdown([], value=None, label="From page", elem_id="range-from", scale=2)
                        range_to = gr.Dropdown([], value=None, label="To page", elem_id="range-to", scale=2)
                        first_part = gr.Button("First part that fits", size="sm", elem_id="first-part", scale=1)
                    range_info = gr.HTML("", elem_id="range-info")
                truncate = gr.Checkbox(label="Truncate to fit (read the beginning that fits)", visible=False,
                                       elem_id="truncate")
                with gr.Row(elem_classes="button-row"):
                    read_button = gr.Button("Read documents", variant="primary", interactive=False, elem_id="read")
                    cancel_button = gr.Button("Cancel", interactive=False, elem_id="cancel")
                progress = gr.HTML(render.progress_bar(), label="Reading progress", elem_id="prefill-progress")
                remember = gr.Checkbox(True, label="Remember read documents on disk", visible=saving,
                                       elem_id="remember",
                                       info="Reopening them later takes seconds instead of reading them again.")
                with gr.Accordion("Saved documents", open=False, visible=saving, elem_id="saved-docs-section") as shelf:
                    saved_list = gr.HTML(render.saved_panel([], None, enabled=saving), label="Saved documents",
                                         elem_id="saved-docs")
                    with gr.Row(elem_classes="button-row", elem_id="saved-actions"):
                        # allow_custom_value: the choices are per tab and refreshed often; the handler checks the key.
                        saved_choice = gr.Dropdown([], value=None, label="Saved document", scale=4,
                                                   allow_custom_value=True, elem_id="saved-choice")
                        open_button = gr.Button("Open", variant="primary", size="sm", scale=1, min_width=70,
                                                elem_id="open-saved")
                        delete_button = gr.Button("Delete", variant="stop", size="sm", scale=1, min_width=70,
                                                  elem_id="delete-saved")
            with gr.Column(scale=6, min_width=340, elem_id="chat-column"):
                chat = gr.Chatbot(label="Questions and answers", elem_id="chat", height=440, feedback_options=None,
                                  placeholder="Answers about your documents appear here, with their speed.",
                                  buttons=["copy"], layout="bubble")
                with gr.Row(elem_classes="ask-row"):
                    question = gr.Textbox(label="Question", placeholder="Ask about the documents…", show_label=False,
                                          scale=6,
                                          min_width=120, elem_id="question", lines=1, max_lines=4)
                    ask_button = gr.Button("Ask", variant="primary", scale=1, min_width=70, elem_id="ask")
                    stop_button = gr.Button("Stop", scale=1, min_width=70, elem_id="stop")
                bar = gr.HTML(render.question_bar(None, 512), label="Longest question", elem_id="question-bar")
                with gr.Row(elem_classes="button-row"):
                    new_chat_button = gr.Button("New chat", size="sm", elem_id="new-chat")
                    clear_button = gr.Button("Clear documents", size="sm", variant="stop", elem_id="clear")
                page_chips = gr.Radio([], label="Pages this answer cites or used", visible=False,
                                      elem_id="page-chips", elem_classes="chips")
                page_view = gr.HTML(render.page_view(None), label="Page", elem_id="page-view")
                with gr.Accordion("Answer settings", open=False, elem_id="settings"):
                    max_tokens = gr.Slider(8, DocumentSession.LONGEST_ANSWER, value=min(512, DocumentSession.LONGEST_ANSWER),
                                           step=8, label="Longest answer (tokens)")
                    temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05,
                                            label="Temperature (0 = always the most likely word)")
                    avoid_repeats = gr.Checkbox(True, label="Avoid repetition", elem_id="avoid-repeats",
                                                info="A sampling choice: penalise and stop answers that loop. "
                                                     "Off gives the model's exact greedy continuation.")
                    show_sources = gr.Checkbox(True, label="Show sources", elem_id="show-sources",
                                               info="The pages each answer attended to most, read from the "
                                                    "model's attention (a small extra pass after the answer).")
        if picker is not None:
            picker(state)

        # One upload at a time: reading and tokenizing a large file takes memory, so visitors queue for it.
        files.change(handlers.choose_files, [files, state], [state, table, plan, truncate, read_button, status_box],
                     api_name="upload", concurrency_id="ingest", concurrency_limit=1, show_progress="minimal").then(
            handlers.range_offer, [state], [range_box, range_from, range_to, range_info], api_visibility="private",
            **_LIGHT)
        chosen_range = [state, range_info, plan, truncate, read_button, status_box]
        for picker in (range_from, range_to):
            picker.change(handlers.choose_range, [range_from, range_to, state], chosen_range,
                          api_visibility="private", concurrency_id="ingest", concurrency_limit=1, show_progress="hidden")
        first_part.click(handlers.first_part, [state], [range_from, range_to, status_box], api_name="first_part",
                         **_LIGHT)
        saved_view = [saved_list, saved_choice]
        # Wired before the private refreshes below, which would otherwise take the name "saved".
        shelf.expand(handlers.saved, None, saved_view, api_name="saved", **_LIGHT)
        read_done = read_button.click(handlers.read, [truncate, state],
                          [state, progress, status_box, chat, read_button, cancel_button, plan, page_chips, page_view],
                          api_name="read", show_progress="minimal", show_progress_on=[progress], **_HEAVY).then(
            handlers.saved, None, saved_view, api_visibility="private", **_LIGHT).then(  # it may have saved one
            handlers.question_bar, [max_tokens, state], [bar], api_visibility="private", **_LIGHT)
        max_tokens.change(handlers.question_bar, [max_tokens, state], [bar], api_visibility="private", **_LIGHT)
        remember.change(handlers.set_remember, [remember, state], None, api_name="remember", **_LIGHT)
        delete_button.click(handlers.delete_saved, [saved_choice], [*saved_view, status_box], api_name="delete_saved",
                            **_LIGHT)
        cancel_button.click(handlers.cancel, [state], None, api_name="cancel", **_LIGHT)
        asked = gr.on([ask_button.click, question.submit], handlers.ask,
              [question, chat, max_tokens, temperature, state, avoid_repeats, show_sources],
              [chat, question, status_box, page_chips], api_name="ask", show_progress="minimal",
              show_progress_on=[chat], **_HEAVY)
        page_chips.change(handlers.show_page, [page_chips, state], [page_view], api_name="page", **_LIGHT)
        stop_button.click(handlers.stop, [state], None, api_name="stop", **_LIGHT)
        # Stop the running answer first (light, immediate), then reset in the compute slot, so
        # the reset never races the answer that was using the cache.
        new_chat_done = new_chat_button.click(handlers.stop, [state], None, api_visibility="private", **_LIGHT).then(
            handlers.new_chat, [state], [chat, status_box], api_name="new_chat", show_progress="hidden", **_OWN)
        cleared = clear_button.click(_stop_all, [state], None, api_visibility="private", **_LIGHT).then(
            handlers.clear, [state], [state, files, table, plan, truncate, progress, chat, status_box],
            api_name="clear", show_progress="hidden", **_OWN).then(
            handlers.question_bar, [max_tokens, state], [bar], api_visibility="private", **_LIGHT)
        timer = gr.Timer(METER_SECONDS)
        timer.tick(handlers.meters, [state], [meters], api_visibility="private", **_LIGHT)
        # A first start's "estimating…" reading time becomes the measured one when the measurement lands.
        timer.tick(refreshed_plan, [state, plan], [plan], api_visibility="private", **_LIGHT)
        if callable(model_info):
            def model_changed(state: BrowserState) -> tuple:
                return _model_changed(state, title, current_info())

            timer.tick(model_changed, [state], [header, status_box, progress, plan, read_button],
                       api_visibility="private", **_LIGHT)
        demo.load(handlers.meters, [state], [meters], api_visibility="private", **_LIGHT)
        demo.load(handlers.saved, None, saved_view, api_visibility="private", **_LIGHT)
        opened = [state, table, plan, progress, chat, status_box, read_button, cancel_button, page_chips, page_view]
        saved_choice.change(handlers.open_label, [saved_choice], [open_button], api_visibility="private", **_LIGHT)
        open_button.click(handlers.open_saved, [saved_choice, state], opened, api_name="open_saved",
                          show_progress="minimal", show_progress_on=[progress], **_HEAVY).then(
            handlers.continue_reading, [state], [state, progress, status_box, chat, read_button, cancel_button, plan],
            api_visibility="private", show_progress="minimal", show_progress_on=[progress], **_HEAVY).then(
            handlers.saved, None, saved_view, api_visibility="private", **_LIGHT).then(
            handlers.question_bar, [max_tokens, state], [bar], api_visibility="private", **_LIGHT).then(
            handlers.tab_memory, [state], [tab_memory], api_visibility="private", **_LIGHT)
        demo.load(handlers.resume, [tab_memory, state], opened, js=_RECALL_JS, api_visibility="private",
                  show_progress="hidden", **_HEAVY).then(
            handlers.question_bar, [max_tokens, state], [bar], api_visibility="private", **_LIGHT)
        tab_memory.change(None, [tab_memory], None, js=_REMEMBER_JS)
        for event in (read_done, asked, new_chat_done, cleared):
            event.then(handlers.tab_memory, [state], [tab_memory], api_visibility="private", **_LIGHT)
        demo.unload(handlers.unload)
    demo.queue(default_concurrency_limit=1)
    return demo


_TAB_KEY = "headinfer-studio-tab"
_RECALL_JS = f"(memory, state) => [sessionStorage.getItem('{_TAB_KEY}') || '', state]"
_REMEMBER_JS = f"(memory) => {{ sessionStorage.setItem('{_TAB_KEY}', memory || ''); }}"


def _stop_all(state: BrowserState) -> None:
    Handlers.cancel(state)
    Handlers.stop(state)


def _model_changed(state: BrowserState, title: str, info: dict) -> tuple:
    """The tab's header, status, progress, plan and read button once the served model changed; skips otherwise."""
    if state.model_seen == info.get("serial"):
        return (gr.skip(),) * 5
    first, state.model_seen = state.model_seen is None, info.get("serial")
    header, note = _header(title, info), Handlers.forget_switched(state)
    if note:  # this tab's document was closed by the switch: its files stay chosen, to be read again
        return (header, status("warn", note + " Press “Read documents” to read them with the new model."),
                render.progress_bar(), render.replan_notice(), gr.update(interactive=bool(state.documents)))
    if first:
        return header, *(gr.skip(),) * 4
    return header, status("info", f"Now serving {render.model_name(info)}."), *(gr.skip(),) * 3


def _header(title: str, model_info: dict) -> str:
    logo = (ASSETS / "logo.svg").read_text(encoding="utf-8")
    return (f'<div class="brand">{logo}<div><h1>{html.escape(title)}</h1>'
            f'{render.model_header(model_info)}</div></div>')
