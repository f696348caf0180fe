"""The page: layout and event wiring. ``build_ui`` builds it, in two steps: ``_layout`` places the components (a
``Page``), and ``_wire`` connects their events to ``app.handlers.Handlers``; nothing happens at import time.

Heavy events (reading documents, answering) wait for the compute device in the handlers' own line
(``app.compute_queue``): a waiting visitor's status line shows their place and an estimated wait, and
Cancel, Stop or closing the tab leaves the line. Gradio lets many of them in at once (``"compute"``, up
to ``HEAVY_EVENTS``) so that they can wait there. Saving a read document to disk and reopening one from
there happen inside the read event, so they hold the device too. New chat and Clear touch only the tab's own
session, after its own running work has stopped. Choosing files (reading and tokenizing them) has a Gradio
queue of its own, ``"ingest"``, so uploads go one at a time. Light events (cancel, stop, meters, listing and deleting
saved documents) run at once, even while a heavy one is busy.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import gradio as gr
from starlette.middleware import Middleware

from app import escape, render
from app.app_state import AppState
from app.questions import LONGEST_ANSWER, QUESTION_CHARS, Questions
from app.browser_id import BrowserIdCookie
from app.browser_state import BrowserState
from app.chips import PageChips
from app.csp import ContentSecurityPolicy
from app.documents import SUPPORTED_SUFFIXES
from app.estimate_refresh import refreshed_plan
from app.guard import RequestGuard, guard_lifespan
from app.handlers import Handlers
from app.hosts import AllowedHosts
from app.owner import OwnerGate, owner_middleware
from app.read_offer import read_button
from app.reading import Reading
from app.visitor_caps import CapLimits
from app.render import status
from app.session_binding import SessionBinding
from app.tab_owner import owned
from engine import DocumentSession, SnapshotStore

ASSETS = Path(__file__).resolve().parent.parent / "assets"
COMPUTE = "compute"
HEAVY_EVENTS = 32  # heavy events Gradio runs at once: one computes, the rest wait in app.compute_queue's line
METER_SECONDS = 1.0
_LIGHT = {"concurrency_limit": None, "show_progress": "hidden"}
_HEAVY = {"concurrency_id": COMPUTE, "concurrency_limit": HEAVY_EVENTS}
_OWN = {"concurrency_limit": None}  # new chat / clear: the tab's own session, once its own work has stopped
_UPLOAD_CHECK = (Path(__file__).resolve().parent / "upload_check.js").read_text(encoding="utf-8")


def launch_options(max_upload: int | None = None, owner: OwnerGate | None = None,
                   hosts: AllowedHosts | None = None) -> dict:
    """Look-and-feel arguments for ``Blocks.launch`` (Gradio 6 takes theme and CSS there); ``max_upload``: the
    largest upload in bytes, checked in the page before a byte is sent (the status line says why, in MiB);
    ``owner``: the owner link's gate (``app.owner``) when others can reach the app; ``hosts``: the names the
    app answers to (``app.hosts``; None: loopback only), its requests refused otherwise (``app.guard``)."""
    hosts = hosts or AllowedHosts()
    upload_check = None if max_upload is None else _UPLOAD_CHECK.replace("MAX_UPLOAD_BYTES", str(max_upload))
    # Only this app's names, page, scripts and connections (app.guard, app.csp); the guard also wraps Gradio's own
    # CORS layer, from the lifespan.
    middleware = [Middleware(RequestGuard, hosts=hosts),
                  Middleware(ContentSecurityPolicy, script_texts=[upload_check] if upload_check else [],
                             share=hosts.share_domain is not None),
                  Middleware(BrowserIdCookie),  # a visitor's shelf outlives a reload (app.saved.shelves)
                  Middleware(SessionBinding)]  # a tab's session hash is its browser's alone (app.session_binding)
    # System fonts only: the app must look right offline, without a request to Google Fonts.
    theme = gr.themes.Soft(primary_hue="teal", neutral_hue="slate",
                           font=["system-ui", "Segoe UI", "Roboto", "Helvetica", "Arial", "sans-serif"],
                           font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"])
    return {"theme": theme, "css_paths": [ASSETS / "style.css"], "favicon_path": str(ASSETS / "logo.svg"),
            "app_kwargs": {"middleware": [*middleware, *owner_middleware(owner)], "lifespan": guard_lifespan(hosts)},
            "head": "" if upload_check is None else f"<script>{upload_check}</script>"}


def build_ui(engine_factory: Callable[[], DocumentSession], *, model_info: dict | Callable[[], dict],
             title: str = "HeadInfer Studio", snapshot_store: SnapshotStore | None = None, private: bool = False,
             session_shelves: Path | None = None, upload_dir: Path | None = None,
             picker: Callable[[gr.State], None] | None = None, max_question: int | None = None,
             caps: CapLimits | None = None, notice: str | None = None,
             first_pick: Callable[[gr.Blocks], None] | None = None) -> gr.Blocks:
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
            user (under the store's ``users/`` folder), else per browser in ``session_shelves`` (deleted
            a while after its last tab closes, ``app.saved.shelves``; without that folder such visitors save nothing).
        upload_dir: the folder Gradio keeps uploads in (``app.uploads.prepare_folder``); a tab's uploads
            are deleted when it closes. Set before any component exists, as Gradio reads it then.
        picker: adds the model picker below the page (``app.picker.ModelPicker.build``); None leaves it out.
        max_question: the longest question in tokens (None: what the plan leaves beside the document and answer).
        caps: the per-visitor caps when ``private`` (``app.visitor_caps``; None: its defaults).
        notice: a warning shown above the page to every visitor (``app.auth.OPEN_NOTICE`` when nobody logs in).
        first_pick: adds the card naming the model that reads the most here (``app.first_pick.FirstPick.build``).
    """
    if upload_dir is not None:
        os.environ["GRADIO_TEMP_DIR"] = str(upload_dir)  # Gradio's only setting for it
    handlers = Handlers(engine_factory, snapshot_store, private=private, session_shelves=session_shelves,
                        upload_dir=upload_dir, max_question=max_question, caps=caps)
    current_info = model_info if callable(model_info) else lambda: model_info
    # analytics off: the studio makes no calls home (it is often run offline). delete_cache: uploads
    # older than a day go even from a tab left open (the tab's own are deleted when it closes).
    with gr.Blocks(title=title, fill_width=True, analytics_enabled=False, delete_cache=(3600, 86400)) as demo:
        if notice:
            gr.HTML(status("warn", notice), elem_id="visitor-notice")
        if first_pick is not None:
            first_pick(demo)
        page = _layout(title, current_info, saving=snapshot_store is not None)
        if picker is not None:
            picker(page.state)
        _wire(demo, page, handlers, title, current_info if callable(model_info) else None)
    # Events past HEAVY_EVENTS wait in Gradio's queue; past four times that a flood is refused ("queue full").
    demo.queue(default_concurrency_limit=1, max_size=4 * HEAVY_EVENTS)
    demo.studio_state = handlers.app  # the tabs, line and shelves the OpenAI endpoint shares (app.openai_api.mount)
    return demo


# -- layout ----------------------------------------------------------------------------------------------
class Page:
    """The page's components: made by the layout functions below, read by the wiring ones after them."""

    state: gr.State
    tab_memory: gr.Textbox
    header: gr.HTML
    meters: gr.HTML
    status_box: gr.HTML
    # the documents column
    files: gr.File
    table: gr.HTML
    plan: gr.HTML
    range_box: gr.Group
    range_from: gr.Dropdown
    range_to: gr.Dropdown
    first_part: gr.Button
    range_info: gr.HTML
    truncate: gr.Checkbox
    read_button: gr.Button
    cancel_button: gr.Button
    progress: gr.HTML
    remember: gr.Checkbox
    shelf: gr.Accordion
    saved_list: gr.HTML
    saved_choice: gr.Dropdown
    open_button: gr.Button
    delete_button: gr.Button
    # the chat column
    chat: gr.Chatbot
    question: gr.Textbox
    ask_button: gr.Button
    stop_button: gr.Button
    bar: gr.HTML
    new_chat_button: gr.Button
    clear_button: gr.Button
    page_chips: PageChips
    page_view: gr.HTML
    max_tokens: gr.Slider
    temperature: gr.Slider
    avoid_repeats: gr.Checkbox
    show_sources: gr.Checkbox


def _layout(title: str, current_info: Callable[[], dict], *, saving: bool) -> Page:
    """The components, placed: the top bar, the status line, the documents column beside the chat column."""
    page = Page()
    # delete_callback: Gradio's own expiry of a session is the backstop to ``unload``.
    page.state = gr.State(BrowserState(), delete_callback=lambda s: s.close() if s else None)
    # The tab's saved document and conversation, mirrored into its sessionStorage (that tab's only, kept across
    # a reload) by _REMEMBER_JS and handed back on load by _RECALL_JS.
    page.tab_memory = gr.Textbox(visible=False, elem_id="tab-memory")
    with gr.Row(equal_height=True, elem_id="topbar"):
        # A function as the value: computed at each page load, so a tab opened after a switch shows the new model.
        page.header = gr.HTML(lambda: _header(title, current_info()), elem_id="header", scale=2, min_width=340)
        page.meters = gr.HTML(label="Meters", elem_id="meters", scale=3, min_width=340)
    page.status_box = gr.HTML(status("info", "Drop a book or a stack of documents, read them once, then ask "
                                             "questions about the whole text."), label="Status", elem_id="status")
    with gr.Row(equal_height=False, elem_id="main"):
        with gr.Column(scale=5, min_width=340, elem_id="documents-column"):
            _documents_column(page, saving)
        with gr.Column(scale=6, min_width=340, elem_id="chat-column"):
            _chat_column(page)
    return page


def _documents_column(page: Page, saving: bool) -> None:
    """Files, their plan and page range, the read and its progress, the saved documents."""
    page.files = gr.File(label="Documents", file_count="multiple", file_types=list(SUPPORTED_SUFFIXES),
                         elem_id="file-drop", height=120)
    page.table = gr.HTML(render.files_table([], []), label="Files", elem_id="files-table")
    page.plan = gr.HTML(render.empty_plan(), label="Memory plan", elem_id="plan")
    with gr.Group(visible=False, elem_id="page-range") as page.range_box:
        with gr.Row(equal_height=True):
            page.range_from = gr.Dropdown([], value=None, label="From page", elem_id="range-from", scale=2)
            page.range_to = gr.Dropdown([], value=None, label="To page", elem_id="range-to", scale=2)
            page.first_part = gr.Button("First part that fits", size="sm", elem_id="first-part", scale=1)
        page.range_info = gr.HTML("", elem_id="range-info")
    page.truncate = gr.Checkbox(label="Truncate to fit (read the beginning that fits)", visible=False,
                                elem_id="truncate")
    with gr.Row(elem_classes="button-row"):
        page.read_button = gr.Button("Read documents", variant="primary", interactive=False, elem_id="read")
        page.cancel_button = gr.Button("Cancel", interactive=False, elem_id="cancel")
    page.progress = gr.HTML(render.progress_bar(), label="Reading progress", elem_id="prefill-progress")
    page.remember = gr.Checkbox(True, label="Remember read documents on disk", visible=saving, elem_id="remember",
                                info="Reopening them later takes seconds instead of reading them again.")
    with gr.Accordion("Saved documents", open=False, visible=saving, elem_id="saved-docs-section") as page.shelf:
        page.saved_list = gr.HTML(render.saved_panel([], None, enabled=saving), label="Saved documents",
                                  elem_id="saved-docs")
        with gr.Row(elem_classes="button-row", elem_id="saved-actions"):
            # allow_custom_value: the choices are per tab and refreshed often; the handler checks the key.
            page.saved_choice = gr.Dropdown([], value=None, label="Saved document", scale=4,
                                            allow_custom_value=True, elem_id="saved-choice")
            page.open_button = gr.Button("Open", variant="primary", size="sm", scale=1, min_width=70,
                                         elem_id="open-saved")
            page.delete_button = gr.Button("Delete", variant="stop", size="sm", scale=1, min_width=70,
                                           elem_id="delete-saved")


def _chat_column(page: Page) -> None:
    """The chat, the question box and its bar, the cited pages and their viewer, the answer settings."""
    page.chat = gr.Chatbot(label="Questions and answers", elem_id="chat", height=440, feedback_options=None,
                           placeholder="Answers about your documents appear here, with their speed.",
                           buttons=["copy"], layout="bubble")
    with gr.Row(elem_classes="ask-row"):
        page.question = gr.Textbox(label="Question", placeholder="Ask about the documents…", show_label=False,
                                   scale=6, min_width=120, elem_id="question", lines=1, max_lines=4,
                                   max_length=QUESTION_CHARS)
        page.ask_button = gr.Button("Ask", variant="primary", scale=1, min_width=70, elem_id="ask")
        page.stop_button = gr.Button("Stop", scale=1, min_width=70, elem_id="stop")
    page.bar = gr.HTML(render.question_bar(None, 512), label="Longest question", elem_id="question-bar")
    with gr.Row(elem_classes="button-row"):
        page.new_chat_button = gr.Button("New chat", size="sm", elem_id="new-chat")
        page.clear_button = gr.Button("Clear documents", size="sm", variant="stop", elem_id="clear")
    page.page_chips = PageChips([], label="Pages this answer cites or used", visible=False,
                                elem_id="page-chips", elem_classes="chips")
    page.page_view = gr.HTML(render.page_view(None), label="Page", elem_id="page-view")
    with gr.Accordion("Answer settings", open=False, elem_id="settings"):
        page.max_tokens = gr.Slider(8, LONGEST_ANSWER, value=min(512, LONGEST_ANSWER),
                                    step=8, label="Longest answer (tokens)")
        page.temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05,
                                     label="Temperature (0 = always the most likely word)")
        page.avoid_repeats = gr.Checkbox(True, label="Avoid repetition", elem_id="avoid-repeats",
                                         info="A sampling choice: penalise and stop answers that loop. "
                                              "Off gives the model's exact greedy continuation.")
        page.show_sources = gr.Checkbox(True, label="Show sources", elem_id="show-sources",
                                        info="The pages each answer attended to most, read from the "
                                             "model's attention (a small extra pass after the answer).")


# -- wiring ----------------------------------------------------------------------------------------------
def _wire(demo: gr.Blocks, page: Page, handlers: Handlers, title: str,
          serving: Callable[[], dict] | None) -> None:
    """The page's events, each to its handler. ``serving``: the served model's info when the picker may switch it."""
    # The shelf first: its public "saved" event must be wired before the private refreshes of the list (after a
    # read, after an open), which would otherwise take the name.
    _wire_shelf(demo, page, handlers)
    read_done = _wire_reading(page, handlers)
    asked, new_chat_done = _wire_questions(page, handlers)
    cleared = _wire_tab(demo, page, handlers, title, serving)
    for event in (read_done, asked, new_chat_done, cleared):
        event.then(handlers.tab_memory, [page.state], [page.tab_memory], api_visibility="private", **_LIGHT)
    demo.unload(handlers.unload)


def _read_view(page: Page) -> list:
    """The outputs a ``ReadView`` fills, field for field: a read and a continued read are wired to the same list."""
    return [page.state, page.progress, page.status_box, page.chat, page.read_button, page.cancel_button, page.plan,
            page.page_chips, page.page_view]


def _wire_shelf(demo: gr.Blocks, page: Page, handlers: Handlers) -> None:
    """The saved documents: listed, deleted, opened (a partial read then read on), and the tab's own reopened after
    a reload."""
    state, saved_view = page.state, [page.saved_list, page.saved_choice]
    page.shelf.expand(handlers.saved, None, saved_view, api_name="saved", **_LIGHT)
    page.remember.change(handlers.set_remember, [page.remember, state], None, api_name="remember", **_LIGHT)
    page.delete_button.click(handlers.delete_saved, [page.saved_choice], [*saved_view, page.status_box],
                             api_name="delete_saved", **_LIGHT)
    demo.load(handlers.saved, None, saved_view, api_visibility="private", **_LIGHT)
    opened = [state, page.table, page.plan, page.progress, page.chat, page.status_box, page.read_button,
              page.cancel_button, page.page_chips, page.page_view]
    page.saved_choice.change(handlers.open_label, [page.saved_choice], [page.open_button], api_visibility="private",
                             **_LIGHT)
    _offer_read(page.open_button.click(handlers.open_saved, [page.saved_choice, state], opened, api_name="open_saved",
                                       show_progress="minimal", show_progress_on=[page.progress], **_HEAVY).then(
        handlers.range_offer, [state], [page.range_box, page.range_from, page.range_to, page.range_info],
        api_visibility="private", **_LIGHT).then(
        handlers.continue_reading, [state],
        _read_view(page),
        api_visibility="private", show_progress="minimal", show_progress_on=[page.progress], **_HEAVY).then(
        handlers.saved, None, saved_view, api_visibility="private", **_LIGHT).then(
        handlers.question_bar, [page.max_tokens, state], [page.bar], api_visibility="private", **_LIGHT).then(
        handlers.tab_memory, [state], [page.tab_memory], api_visibility="private", **_LIGHT), page, handlers)
    resumed = demo.load(handlers.resume, [page.tab_memory, state], opened, js=_RECALL_JS, api_visibility="private",
                        show_progress="hidden", **_HEAVY)
    _offer_read(resumed.then(handlers.question_bar, [page.max_tokens, state], [page.bar], api_visibility="private",
                             **_LIGHT), page, handlers)
    page.tab_memory.change(None, [page.tab_memory], None, js=_REMEMBER_JS)


def hold_read():
    """The Read button, not clickable (until a handler that knows what is to be read enables it)."""
    return gr.update(interactive=False)


def _offer_read(event, page: Page, handlers: Handlers):
    """``event``, then “Read documents” set by its one rule (``app.read_offer``): chained after each event that
    changes what it would read (files, range, Truncate, a read, clear, reopening); returns the chain."""
    return event.then(handlers.read_offer, [page.truncate, page.state], [page.read_button], api_visibility="private",
                      **_LIGHT)


def _wire_reading(page: Page, handlers: Handlers):
    """Choosing files (and a page range of a set too large), reading them, cancelling; returns the read's event."""
    state = page.state
    # One upload at a time: reading and tokenizing a large file takes memory, so visitors queue for it.
    # "Read documents" is held first, at once and outside the ingest queue: until the new files' plan lands the
    # button would read the previous set (the tab's state still holds it while an upload waits or is tokenized).
    page.files.change(hold_read, None, [page.read_button], api_visibility="private", **_LIGHT).then(
        handlers.choose_files, [page.files, state],
        [state, page.table, page.plan, page.truncate, page.read_button, page.status_box],
        api_name="upload", concurrency_id="ingest", concurrency_limit=1, show_progress="minimal").then(
        handlers.range_offer, [state], [page.range_box, page.range_from, page.range_to, page.range_info],
        api_visibility="private", **_LIGHT)
    chosen_range = [state, page.table, page.range_info, page.plan, page.truncate, page.read_button, page.status_box]
    for end in (page.range_from, page.range_to):
        _offer_read(end.change(handlers.choose_range, [page.range_from, page.range_to, state], chosen_range,
                               api_visibility="private", concurrency_id="ingest", concurrency_limit=1,
                               show_progress="hidden"), page, handlers)
    page.truncate.change(handlers.read_offer, [page.truncate, state], [page.read_button], api_visibility="private",
                         **_LIGHT)
    page.first_part.click(handlers.first_part, [state], [page.range_from, page.range_to, page.status_box],
                          api_name="first_part", **_LIGHT)
    read_done = _offer_read(page.read_button.click(
        handlers.read, [page.truncate, state],
        _read_view(page),
        api_name="read", show_progress="minimal", show_progress_on=[page.progress], **_HEAVY).then(
        handlers.saved, None, [page.saved_list, page.saved_choice], api_visibility="private",
        **_LIGHT).then(  # it may have saved one
        handlers.question_bar, [page.max_tokens, state], [page.bar], api_visibility="private", **_LIGHT),
        page, handlers)  # (Truncate ticked meanwhile, say)
    page.cancel_button.click(handlers.cancel, [state], None, api_name="cancel", **_LIGHT)
    return read_done


def _wire_questions(page: Page, handlers: Handlers) -> tuple:
    """Asking, stopping, a new chat, the cited pages' viewer, the question bar; returns the ask's and the new chat's
    events."""
    state = page.state
    page.max_tokens.change(handlers.question_bar, [page.max_tokens, state], [page.bar], api_visibility="private",
                           **_LIGHT)
    asked = gr.on([page.ask_button.click, page.question.submit], handlers.ask,
                  [page.question, page.chat, page.max_tokens, page.temperature, state, page.avoid_repeats,
                   page.show_sources],
                  [page.chat, page.question, page.status_box, page.page_chips], api_name="ask",
                  show_progress="minimal", show_progress_on=[page.chat], **_HEAVY)
    page.page_chips.change(handlers.show_page, [page.page_chips, state], [page.page_view], api_name="page", **_LIGHT)
    page.stop_button.click(handlers.stop, [state], None, api_name="stop", **_LIGHT)
    # Stop the running answer first (light, immediate), then reset under the "compute" concurrency id, so
    # the reset never races the answer that was using the cache.
    new_chat_done = page.new_chat_button.click(handlers.stop, [state], None, api_visibility="private",
                                               **_LIGHT).then(
        handlers.new_chat, [state], [page.chat, page.status_box], api_name="new_chat", show_progress="hidden", **_OWN)
    _offer_read(asked, page, handlers)  # (Truncate ticked while it answered)
    return asked, new_chat_done


def _wire_tab(demo: gr.Blocks, page: Page, handlers: Handlers, title: str, serving: Callable[[], dict] | None):
    """The tab as a whole: clearing it, its meters, and following a model switch; returns the clear's event."""
    state = page.state
    cleared = page.clear_button.click(owned(_stop_all), [state], None, api_visibility="private", **_LIGHT).then(
        handlers.clear, [state],
        [state, page.files, page.table, page.plan, page.truncate, page.progress, page.chat, page.status_box,
         page.page_chips, page.page_view],
        api_name="clear", show_progress="hidden", **_OWN).then(
        handlers.range_offer, [state], [page.range_box, page.range_from, page.range_to, page.range_info],
        api_visibility="private", **_LIGHT).then(
        handlers.question_bar, [page.max_tokens, state], [page.bar], api_visibility="private", **_LIGHT)
    _offer_read(cleared, page, handlers)
    timer = gr.Timer(METER_SECONDS)
    timer.tick(handlers.meters, [state], [page.meters], api_visibility="private", **_LIGHT)
    # A first start's "estimating…" reading time becomes the measured one when the measurement lands.
    timer.tick(owned(refreshed_plan), [state, page.plan], [page.plan], api_visibility="private", **_LIGHT)
    if serving is not None:
        def model_changed(state: BrowserState) -> tuple:
            return _model_changed(state, title, serving())

        timer.tick(owned(model_changed), [state],
                   [page.header, page.status_box, page.progress, page.plan, page.read_button],
                   api_visibility="private", **_LIGHT)
    demo.load(handlers.meters, [state], [page.meters], api_visibility="private", **_LIGHT)
    return cleared


_TAB_KEY = "headinfer-studio-tab"
_RECALL_JS = f"(memory, state) => [sessionStorage.getItem('{_TAB_KEY}') || '', state]"
_REMEMBER_JS = f"(memory) => {{ sessionStorage.setItem('{_TAB_KEY}', memory || ''); }}"


def _stop_all(state: BrowserState) -> None:
    Reading.cancel(state)
    Questions.stop(state)


def _model_changed(state: BrowserState, title: str, info: dict) -> tuple:
    """The tab's header, status, progress, plan and read button once the served model changed; skips otherwise."""
    if state.model_seen == info.get("serial"):
        return (gr.skip(),) * 5
    first, state.model_seen = state.model_seen is None, info.get("serial")
    header, note = _header(title, info), AppState.forget_switched(state)
    if note:  # this tab's document was closed by the switch: its files stay chosen, to be read again
        return (header, status("warn", note + " Press “Read documents” to read them with the new model."),
                render.progress_bar(), render.replan_notice(), read_button(state, False))
    if first:
        return header, *(gr.skip(),) * 4
    return header, status("info", f"Now serving {render.model_name(info)}."), *(gr.skip(),) * 3


def _header(title: str, model_info: dict) -> str:
    logo = (ASSETS / "logo.svg").read_text(encoding="utf-8")
    return (f'<div class="brand">{logo}<div><h1>{escape.text(title)}</h1>'
            f'{render.model_header(model_info)}</div></div>')
