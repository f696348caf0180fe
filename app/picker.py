"""The model picker: which model reads the most on this machine, fetching it, and serving it instead.

A sortable table of the curated catalogue plus the models found on disk, each planned from its config alone
(``engine.models.catalogue``); a download through ``huggingface_hub`` with progress and cancel (``engine.models.downloads``);
and a switch of the served model (``engine.ModelHolder``, ``engine/serving.py``) that gives the old model's memory back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
from gradio.utils import get_upload_folder

from app import escape
from app.browser_state import BrowserState
from app.owner import OPEN, REFUSED, OwnerGate
from app.render import status
from byte_units import format_bytes, in_gib
from engine import ModelHolder
from engine.errors import SwitchFailed
from engine.models import (
    READ_TOKENS,
    DownloadJob,
    DownloadProgress,
    Entry,
    Fit,
    Machine,
    fit_weights_label,
    ModelSourceError,
    cached_snapshot,
    count_tokens,
    detect_machine,
    discover,
    load_catalogue,
    pin_status,
    plan_entry,
    pypi_model_gguf,
    rank,
    update_pin,
)

logger = logging.getLogger(__name__)

COLUMNS = ["Model", "Reads here (tokens)", "Your documents (tokens)", "Reads of your documents", "RAM (tokens)",
           "8-bit KV (tokens)", "Disk tier (tokens)", "Window (tokens)", f"Read {READ_TOKENS // 1000}K tokens (min)",
           "Decode (s/token)", "Params (B)", "Download (GiB)", "License", "Published long-context score", "Where",
           "Notes", "Weights as planned"]
_POLL_SECONDS = 0.5


def table_rows(fits: list[Fit], serving: str, counts: dict[str, tuple[int, str]] | None = None) -> list[list]:
    """One row per model, numbers left as numbers so the table sorts them as such. ``counts``: the tab's documents
    in each model's tokens and how they were counted (``document_counts``), keyed like the table's choices."""
    rows = []
    for fit in fits:
        e = fit.entry
        score = "; ".join(f"{s['name']} {s['value']} ({s['source']})" for s in e.scores) or ""
        tokens, counted = (counts or {}).get(e.location or e.id, (None, ""))
        rows.append([e.id, fit.reads_tokens, tokens if tokens is not None else "",
                     _share_read(fit.reads_tokens, tokens, counted), fit.ram_tokens, fit.int8_tokens,
                     fit.disk_tokens or 0, fit.window or 0, round(fit.read_seconds / 60, 1),
                     round(fit.decode_seconds, 3), round(e.params / 1e9, 2), in_gib((e.download_gb or 0) * 1e9),
                     e.license, score, where(e, serving), " ".join(fit.notes), _weights(fit)])
    return rows


def _weights(fit: Fit) -> str:
    """The quantization the plan assumed, in the header's words (lossy said so), and the bytes it holds."""
    return f"{fit_weights_label(fit)}, {format_bytes(fit.weights_bytes)}"


def _share_read(reads: int, tokens: int | None, counted: str) -> str:
    if tokens is None:
        return counted  # (why there is no count, or nothing dropped yet)
    if reads == 0:
        share = "none (the model does not fit here)"
    else:
        share = "all of them" if tokens <= reads else f"{100 * reads / tokens:.0f}% (the first {reads:,} tokens)"
    return f"{share}; {counted}"


def document_counts(fits: list[Fit], serving: str, text: str, served_tokens: int) -> dict[str, tuple[int, str]]:
    """The tab's documents in each listed model's tokens: the served model's own count (the session tokenized them);
    any other model's through Llama 3's tokenizer, exact for Llama 3 models and an estimate for the others (their
    tokenizers are not here before their download). A count that cannot be made names why instead."""
    others = [fit.entry for fit in fits if where(fit.entry, serving) != "serving now"]
    try:
        counted = count_tokens(text, [e.config for e in others]) if others else []
    except ModelSourceError as error:  # the tokenizer could not be fetched (offline): the table stays
        logger.warning("no token counts for the picker: %s", error)
        counted = [None] * len(others)
    counts: dict[str, tuple[int | None, str]] = {}
    for entry, count in zip(others, counted):
        counts[entry.location or entry.id] = (
            (None, "not counted: Llama 3's tokenizer could not be fetched from PyPI") if count is None else
            (count.tokens, "exact (Llama 3 tokenizer)" if count.exact else "an estimate (Llama 3 tokenizer)"))
    for fit in fits:
        if where(fit.entry, serving) == "serving now":
            counts[fit.entry.location or fit.entry.id] = (served_tokens, "counted by the model itself")
    return counts


def pins(entries: list[Entry]) -> str:
    """Which Hub commit each catalogue model downloads (``engine.models.pin_status``): pinned by the catalogue, by
    this machine's first download or the owner's update, or not yet."""
    items = "".join(f"<li>{escape.text(e.id)}: {escape.text(pin_status(e.id))}</li>" for e in entries
                    if e.source == "catalogue" and not e.pypi and not e.location)
    return (f"<details class='picker-pins' id='picker-pins'><summary>Hub revisions each download fetches</summary>"
            f"<ul>{items}</ul></details>" if items else "")


def where(entry: Entry, serving: str) -> str:
    if serving in (entry.id, entry.location, f"pypi:{entry.pypi}"):
        return "serving now"
    if entry.location:
        return f"{entry.source}: {entry.location}"
    if entry.pypi:
        return "PyPI (runs without the Hub)"
    return "Hugging Face Hub" + (" (gated: log in)" if entry.gated else "")


class ModelPicker:
    """The picker's state, shared by every tab: one download at a time, one served model (``holder``).

    ``owner``: who may scan folders, download and serve (``app.owner``; open: everyone, as on a plain local start);
    a visitor sees the catalogue alone, no server path. ``uploads``: folders visitors' files are uploaded into
    (besides Gradio's own), never a model source for anyone. ``endpoint``: the Hub (None: ``HF_ENDPOINT`` or
    huggingface.co)."""

    def __init__(self, holder: ModelHolder, *, device: str, user_folders: list[str] | None = None,
                 owner: OwnerGate = OPEN, uploads: list[Path] | None = None, endpoint: str | None = None):
        self.holder, self.device, self.owner, self.endpoint = holder, device, owner, endpoint
        self.user_folders = list(user_folders or [])
        self._uploads = list(uploads or [])
        self._entries: dict[str, Entry] = {}
        self._machine: tuple[object, Machine] | None = None
        self._job: DownloadJob | None = None
        self._lock = threading.Lock()

    # -- the table -------------------------------------------------------------------------------
    def machine(self) -> Machine:
        if self._machine is None or self._machine[0] is not self.holder.model:
            self._machine = (self.holder.model, detect_machine(self.holder.model, device=self.device))
        return self._machine[1]

    def refresh(self, folder: str | None = None, state: BrowserState | None = None,
                request: gr.Request = None) -> tuple[list[list], str, dict]:
        """The table, the machine line and the model choices; ``folder``: one more folder to look in; ``state``: the
        tab, whose chosen documents are counted in each model's tokens. A visitor's table is the catalogue alone:
        no folder is scanned for them, and no server path is shown."""
        refused = ""
        if self.owner.is_owner(request):
            if folder and folder.strip() and folder.strip() not in self.user_folders:
                self.user_folders.append(folder.strip())
            entries = load_catalogue() + [e for e in discover(self.user_folders) if not self._uploaded(e.location)]
            self._entries = {e.location or e.id: e for e in entries}  # what the owner may download or serve
        else:
            entries = load_catalogue()
            if folder and folder.strip():
                logger.warning("a visitor's folder scan was refused")
                refused = f"<p class='picker-refused'><b>Not scanned.</b> {escape.text(REFUSED)}</p>"
        machine = self.machine()
        fits = rank([plan_entry(e, machine) for e in entries])
        line = (f"<p class='picker-machine'>{escape.text(machine.name)}. <b>Reads here</b>: the longest document "
                f"read exactly (RAM, or RAM plus a disk tier), capped at the model's trained window; 8-bit KV "
                f"holds more, lossy. Planned from each config before any download.</p>") + pins(entries)
        choices = [(f"{f.entry.id} — {f.reads_tokens:,} tokens", f.entry.location or f.entry.id) for f in fits]
        counts = None
        if state is not None and state.documents:
            text = "\n\n".join(document.text for document in state.documents)
            counts = document_counts(fits, self.holder.name, text, sum(state.token_counts))
            line += ("<p class='picker-machine'><b>Your documents</b>: the files dropped in this tab, in each model's "
                     "tokens, before any download: exact for the model serving now and for Llama 3 models (their "
                     "tokenizer is counted here with tiktoken), an estimate with the same tokenizer for the others."
                     "</p>")
        return table_rows(fits, self.holder.name, counts), refused + line, gr.update(choices=choices)

    def refresh_for(self, state: BrowserState | None, request: gr.Request = None) -> tuple[list[list], str, dict]:
        """``refresh`` with no folder added (the events that pass only the tab)."""
        return self.refresh(None, state, request)

    def refresh_alone(self, request: gr.Request = None) -> tuple[list[list], str, dict]:
        """``refresh`` with neither a folder nor a tab (a page built without the tab's state)."""
        return self.refresh(None, None, request)

    def _uploaded(self, location: str | None) -> bool:
        """Whether ``location`` lies in an upload folder (a link into one included): a visitor's file, never a model."""
        if not location:
            return False
        path = Path(location).expanduser().resolve()
        return any(path.is_relative_to(Path(root).resolve()) for root in [*self._uploads, get_upload_folder()])

    # -- downloads -------------------------------------------------------------------------------
    def download(self, choice: str | None, request: gr.Request = None) -> Iterator[str]:
        if not self.owner.is_owner(request):
            logger.warning("a visitor's download was refused")
            yield status("warn", REFUSED)
            return
        entry = self._entries.get(choice or "")
        if entry is None or entry.location or entry.pypi:
            yield status("warn", "Pick a model from the Hub in the list (models on disk or on PyPI need no download).")
            return
        progress: list[DownloadProgress] = []
        with self._lock:
            if self._job is not None:
                yield status("warn", f"{self._job.repo_id} is downloading; cancel it or wait.")
                return
            self._job = job = DownloadJob(entry.id, endpoint=self.endpoint, on_progress=progress.append)
        outcome: dict = {}
        worker = threading.Thread(target=lambda: _run(job, outcome), daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                worker.join(_POLL_SECONDS)
                if progress:
                    p = progress[-1]
                    yield status("info", f"Downloading {entry.id}: {format_bytes(p.done_bytes)} of "
                                         f"{format_bytes(p.total_bytes)} ({100 * p.fraction:.0f}%), file "
                                         f"{min(p.files_done + 1, p.files_total)} of {p.files_total}")
        finally:
            with self._lock:
                self._job = None
        if "error" in outcome:
            yield status("warn", str(outcome["error"]))
        else:
            yield status("ok", f"Downloaded {entry.id} into the Hugging Face cache "
                               f"({outcome['folder']}). Press “Serve this model” to use it.")

    def cancel(self, request: gr.Request = None) -> None:
        if not self.owner.is_owner(request):
            logger.warning("a visitor's cancel of the download was refused")
            return
        with self._lock:
            if self._job is not None:
                self._job.cancel()

    def update(self, choice: str | None, request: gr.Request = None) -> str:
        """The owner's "update to the latest": pins the chosen Hub model to the commit its branch holds today."""
        if not self.owner.is_owner(request):
            logger.warning("a visitor's update of a model's pinned revision was refused")
            return status("warn", REFUSED)
        entry = self._entries.get(choice or "")
        if entry is None or entry.location or entry.pypi:
            return status("warn", "Pick a model from the Hub in the list.")
        try:
            old, new = update_pin(entry.id, endpoint=self.endpoint)
        except ModelSourceError as error:  # pinned by the catalogue, offline, gated, a damaged lock file
            return status("warn", str(error))
        was = f"was {old.short}" if old is not None else "unpinned before"
        return status("ok", f"{entry.id} is now pinned to {new.short} ({was}). Press “Download” to fetch that "
                            f"commit; until then “Serve” finds no copy of it.")

    # -- switching -------------------------------------------------------------------------------
    def announce(self, choice: str | None, request: gr.Request = None) -> str:
        """Before the switch starts: which order it takes (``switch_order``); nothing when it would be refused."""
        servable = self._servable(choice, request)
        if isinstance(servable, str):
            return ""
        entry, fit = servable
        return status("info", f"{switch_order(entry.id, self.holder, fit)} Loading {entry.id}…")

    def serve(self, choice: str | None, request: gr.Request = None) -> str:
        servable = self._servable(choice, request)
        if isinstance(servable, str):
            return servable
        entry, fit = servable
        self._machine = None  # it holds the served model: a switch that unloads it first must be able to free it
        try:
            report = self.holder.switch(self._source(entry), name=entry.id, weights_bytes=fit.weights_bytes)
        except SwitchFailed as error:  # the old model was unloaded first: loaded back, or none is served
            logger.warning("switch to %s failed: %s", entry.id, error)
            return status("warn", f"{str(error)[:1].upper()}{str(error)[1:]}.")
        except Exception as error:  # unsupported, missing, gated, not downloaded: the old model keeps serving
            logger.warning("switch to %s failed: %s", entry.id, error)
            return status("warn", f"Still serving {self.holder.name}: {str(error)}")
        first = f", after unloading {report.old}: the two did not fit together" if report.unloaded_first else ""
        return status("ok", f"Now serving {report.new} (loaded in {report.load_seconds:.0f} s{first}). "
                            f"{format_bytes(report.returned_bytes)} of memory returned from {report.old}; "
                            f"{report.closed_documents} open document set(s) closed: read them again with the new "
                            f"model. Saved documents stay tied to the model that read them.")

    def _servable(self, choice: str | None, request: gr.Request) -> tuple[Entry, Fit] | str:
        """The chosen entry and its plan here, or the status line saying why it is not served."""
        if not self.owner.is_owner(request):
            logger.warning("a visitor's switch of the served model was refused")
            return status("warn", REFUSED)
        entry = self._entries.get(choice or "")
        if entry is None:
            return status("warn", "Pick a model in the list first.")
        if self._uploaded(entry.location):  # listed before it lay there, or reached through a link made since
            logger.warning("refused to serve %s: it lies in an upload folder", entry.location)
            return status("warn", "An uploaded file is never served as a model.")
        fit = plan_entry(entry, self.machine())
        if not fit.supported or fit.reads_tokens == 0:
            return status("warn", " ".join(fit.notes[:1]) or "It does not fit here.")
        return entry, fit

    @staticmethod
    def _source(entry: Entry) -> str | None:
        if entry.location:
            return entry.location
        if entry.pypi == "embedded":
            return None
        if entry.pypi:
            return str(pypi_model_gguf(entry.pypi))
        folder = cached_snapshot(entry.id)
        if folder is None:
            raise FileNotFoundError(f"{entry.id} is not downloaded yet: press “Download” first")
        return str(folder)

    # -- the page --------------------------------------------------------------------------------
    def build(self, state: gr.State | None = None) -> None:
        """Adds the picker to the page being built (call inside ``gr.Blocks``); ``state``: the tab's ``BrowserState``,
        whose documents the table counts in each model's tokens."""
        with gr.Accordion("Models: which reads the most on this machine", open=False, elem_id="picker") as section:
            machine = gr.HTML(elem_id="picker-machine")
            table = gr.Dataframe(headers=COLUMNS, interactive=False, wrap=True, elem_id="picker-table",
                                 label="Models (click a column to sort)")
            with gr.Row(elem_classes="button-row"):
                choice = gr.Dropdown([], label="Model", scale=4, elem_id="picker-choice")
                download = gr.Button("Download", size="sm", scale=1, elem_id="picker-download")
                cancel = gr.Button("Cancel download", size="sm", scale=1, elem_id="picker-cancel")
                serve = gr.Button("Serve this model", variant="primary", size="sm", scale=1, elem_id="picker-serve")
                update = gr.Button("Update to the latest", size="sm", scale=1, elem_id="picker-update")
            with gr.Row(elem_classes="button-row"):
                folder = gr.Textbox(label="Also look in this folder (models or .gguf files)", scale=4,
                                    elem_id="picker-folder")
                scan = gr.Button("Scan this machine", size="sm", scale=1, elem_id="picker-scan")
            note = gr.HTML(elem_id="picker-status")
            if self.owner.private:  # on every tab's page; the actions themselves check the owner's cookie
                gr.HTML(f"<p class='picker-owner-note'>{escape.text(REFUSED)} Visitors see the catalogue.</p>",
                        elem_id="picker-owner-note")
        view = [table, machine, choice]
        # The table again (opened, after a download or a switch), counting this tab's documents where it has some.
        tab = [state] if state is not None else []
        again = self.refresh_for if tab else self.refresh_alone
        section.expand(again, tab or None, view, api_name="models", show_progress="minimal")
        scan.click(self.refresh, [folder, *tab], view, api_name="scan_models", show_progress="minimal")
        # Then the table again: the model is now in the Hugging Face cache, ready to serve.
        download.click(self.download, [choice], [note], api_name="download_model", concurrency_id="download",
                       concurrency_limit=1).then(again, tab or None, view, api_visibility="private")
        cancel.click(self.cancel, None, None, api_name="cancel_download", concurrency_limit=None)
        update.click(self.update, [choice], [note], api_name="update_model_pin", concurrency_id="download",
                     concurrency_limit=1).then(again, tab or None, view, api_visibility="private")
        # One at a time with reads and answers (the "compute" concurrency id): a switch never races a read or an answer on the model it replaces.
        # The order the switch takes is said first, at once; the switch then waits its turn.
        serve.click(self.announce, [choice], [note], concurrency_limit=None, api_visibility="private").then(
            self.serve, [choice], [note], api_name="serve_model", concurrency_id="compute",
            concurrency_limit=1).then(again, tab or None, view, api_visibility="private")

def switch_order(new: str, holder: ModelHolder, fit: Fit) -> str:
    """Which order serving ``new`` takes: beside the served model (it stays until the new one is ready), or after
    unloading it (two do not fit; it is loaded back if the new one fails), from ``holder.order_for``."""
    old = holder.name
    if holder.model is None:
        return f"No model is served: {new} is loaded."
    order = holder.order_for(fit.weights_bytes)
    size, room = format_bytes(fit.weights_bytes), format_bytes(order.room)
    if order.fits:
        return (f"{new} ({size}) fits beside {old} in {room} free: it is loaded first and {old} serves until it is "
                f"ready; if it fails to load, {old} keeps serving.")
    return (f"{new} ({size}) does not fit beside {old} in {room} free: {old} is unloaded first; if the new one fails "
            f"to load, {old} is loaded back.")


def _run(job: DownloadJob, outcome: dict) -> None:
    started = time.perf_counter()
    try:
        outcome["folder"] = job.run()
    except Exception as error:  # shown to the user as it is: cancelled, gated, corrupt, offline
        outcome["error"] = error
    logger.info("download of %s ended after %.0f s: %s", job.repo_id, time.perf_counter() - started,
             outcome.get("error") or "done")
