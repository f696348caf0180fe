"""The first page's card: the model this machine reads whole books with, one click from being served.

Where the Hub answers (``HubProbe``: one bounded request, off the page's load, its answer kept a while) and the
picker's pick reads more tokens here than the served model, a card names it: what it reads here, the weights as
they would be held (the quantization the plan assumed, lossy where quantized), the download and its time at a
stated rate, with one button that downloads it and then serves it through the picker's own paths
(``ModelPicker.download`` then ``ModelPicker.serve``: the same progress, cancel and owner gate). Offline, or when
the served model is already the pick, the card stays hidden. A switch made in the picker (from any tab) shows in
every tab's card within ``FOLLOW_SECONDS``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gradio as gr

from app import escape
from app.picker import ModelPicker, where
from app.render import status
from byte_units import format_bytes, format_rate
from engine.models import Entry, Fit, fit_weights_label, load_catalogue, plan_entry, rank

logger = logging.getLogger(__name__)

HUB = "https://huggingface.co"
PROBE_SECONDS = 3.0  # the probe's bound: a page never waits on the Hub longer than this
PROBE_KEEP_SECONDS = 300.0  # how long an answer (reachable or not) is kept before the Hub is asked again
FOLLOW_SECONDS = 1.0  # how often a tab's card looks for a switch made in the picker (the header's pace)
STATED_RATE = 50 * 2**20  # bytes/s: the download rate the card's time assumes (a home line's; not measured here)
_DOWNLOADED = status("ok", "Downloaded").split("Downloaded")[0] + "Downloaded"  # the picker's words for a whole one

def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


class HubProbe:
    """Whether the Hub answers at ``endpoint``: one GET of a model's info (any HTTP answer counts, a 404 or a 401
    included), in a thread of its own, bounded by ``timeout``; the answer is kept ``keep`` seconds."""

    def __init__(self, *, timeout: float = PROBE_SECONDS, keep: float = PROBE_KEEP_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.timeout, self.keep, self._clock = timeout, keep, clock
        self._answers: dict[str, tuple[float, bool]] = {}
        self._running: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def reachable(self, endpoint: str, repo_id: str, wait: float | None = None) -> bool | None:
        """The kept answer, else a probe started (one at a time per endpoint) and waited for up to ``wait``
        seconds (default: the probe's bound); None when it has not answered by then."""
        if _offline():
            return False
        with self._lock:
            kept = self._answers.get(endpoint)
            if kept is not None and self._clock() - kept[0] < self.keep:
                return kept[1]
            done = self._running.get(endpoint)
            if done is None:
                done = self._running[endpoint] = threading.Event()
                threading.Thread(target=self._probe, args=(endpoint, repo_id, done), daemon=True,
                                 name="hub-probe").start()
        done.wait(self.timeout + 0.5 if wait is None else wait)
        with self._lock:
            kept = self._answers.get(endpoint)
        return kept[1] if kept is not None else None

    def _probe(self, endpoint: str, repo_id: str, done: threading.Event) -> None:
        url = f"{endpoint.rstrip('/')}/api/models/{repo_id}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout):  # noqa: S310 (the Hub's own address)
                answered = True
        except urllib.error.HTTPError:  # it answered, with a refusal: reachable all the same
            answered = True
        except (OSError, ValueError) as error:  # refused, timed out, no route, no name: offline
            logger.info("the Hub at %s did not answer: %s", endpoint, error)
            answered = False
        with self._lock:
            self._answers[endpoint] = (self._clock(), answered)
            self._running.pop(endpoint, None)
        done.set()


@dataclass(frozen=True)
class Pick:
    """The card's facts: the pick's plan here and the served model's reach beside it."""

    fit: Fit
    served: str
    served_tokens: int


def downloadable(entry: Entry) -> bool:
    """A catalogue model one click can fetch: from the Hub (no file on disk, no PyPI package), not gated."""
    return entry.source == "catalogue" and not entry.location and not entry.pypi and not entry.gated


def choose(picker: ModelPicker) -> Pick | None:
    """The picker's pick among the models one click fetches (``rank``: what reads the most here, as far as its
    answers hold), or None when it reads no more than the served model."""
    machine = picker.machine()
    fits = rank([plan_entry(e, machine) for e in load_catalogue()])
    served_fit = next((f for f in fits if where(f.entry, picker.holder.name) == "serving now"), None)
    served_tokens = served_fit.reads_well if served_fit is not None else _served_reach(picker)
    best = next((f for f in fits if f.supported and f.reads_well > 0 and downloadable(f.entry)), None)
    if best is None or best.reads_well <= served_tokens:
        return None
    return Pick(best, picker.holder.name, served_tokens)


def _served_reach(picker: ModelPicker) -> int:
    """What a served model the catalogue does not list (a folder, a GGUF file) reads here, planned from its config."""
    try:
        config = picker.holder.model.config.get_text_config().to_dict()
        entry = Entry(picker.holder.name, str(config.get("model_type")), config,
                      int(picker.holder.info().get("params") or 0), None, "")
        return plan_entry(entry, picker.machine()).reads_well
    except Exception as error:  # a config the planner cannot read: the card compares against nothing
        logger.warning("the served model could not be planned for the first page's card: %s", error)
        return 0


def card_html(pick: Pick) -> str:
    """The card's facts, every value escaped."""
    fit, entry = pick.fit, pick.fit.entry
    held = fit_weights_label(fit)  # the header's and the picker's words, lossy said so
    reads = f"{fit.reads_well:,} tokens"
    if fit.reads_tokens > fit.reads_well:
        reads += f" ({fit.reads_tokens:,} fit; answers degrade past {fit.reads_well:,}, its card says)"
    download = ""
    if entry.download_gb:
        size = entry.download_gb * 1e9  # the catalogue's sizes are the Hub's, in decimal GB
        download = (f" Downloads {format_bytes(size)}: about {size / STATED_RATE / 60:.0f} min at "
                    f"{format_rate(STATED_RATE)} (a stated rate, not measured on this line).")
    return (f"<div class='first-pick' id='first-pick-card' data-pick='{escape.attr(entry.id)}'>"
            f"<p><b>Reads whole books here: {escape.text(entry.id)}</b> reads {escape.text(reads)} on this machine; "
            f"{escape.text(pick.served)}, served now, reads {escape.text(f'{pick.served_tokens:,}')}.</p>"
            f"<p>Held as {escape.text(held)} ({escape.text(format_bytes(fit.weights_bytes))})."
            f"{escape.text(download)} License: {escape.text(entry.license)}.</p></div>")


def _tab(request: gr.Request | None) -> str | None:
    return getattr(request, "session_hash", None)


class FirstPick:
    """The card over ``picker`` (its machine, served model, downloads and owner gate); ``endpoint``: the Hub
    (None: the picker's, else ``HF_ENDPOINT``, else huggingface.co)."""

    def __init__(self, picker: ModelPicker, *, probe: HubProbe | None = None, endpoint: str | None = None):
        self.picker, self.probe = picker, probe or HubProbe()
        self._endpoint = endpoint
        self._kept: tuple[tuple, Pick | None] | None = None
        self._ready: set[tuple[str | None, str]] = set()  # (tab, model) whose click's download ended whole
        self._lock = threading.Lock()
        self._planning = threading.Lock()  # one plan at a time: every tab's tick after a switch asks at once

    @property
    def endpoint(self) -> str:
        return self._endpoint or self.picker.endpoint or os.environ.get("HF_ENDPOINT") or HUB

    def pick(self) -> Pick | None:
        """``choose``, kept while the served model and the machine stay the same (planning takes a second)."""
        with self._planning:
            key = (self.picker.holder.name, id(self.picker.machine()))
            if self._kept is None or self._kept[0] != key:
                self._kept = (key, choose(self.picker))
            return self._kept[1]

    def show(self) -> tuple[dict, str]:
        """``(the card's visibility, its facts)``: shown only where the Hub answers and the pick beats the served
        model; the same facts for the owner and a visitor (the button is what the owner gate guards)."""
        pick = self.pick()
        if pick is None or not self.probe.reachable(self.endpoint, pick.fit.entry.id):
            return gr.update(visible=False), ""
        return gr.update(visible=True), card_html(pick)

    def shown(self) -> tuple[str, dict, str]:
        """``show`` with the served model it was made for (the tab keeps it, to see a switch)."""
        return (self.picker.holder.name, *self.show())

    def follow(self, seen: str | None) -> tuple:
        """The card again once the served model is not the one this tab's card was made for (a switch in the
        picker, from any tab); skips otherwise."""
        if seen == self.picker.holder.name:
            return (gr.skip(),) * 3
        return self.shown()

    def download(self, request: gr.Request = None) -> Iterator[str]:
        """The picker's download of the pick, its progress as the picker words it (a visitor is refused there)."""
        pick = self.pick()
        if pick is None:
            yield status("info", f"{self.picker.holder.name} already reads the most here.")
            return
        if self.picker.owner.is_owner(request):
            self.picker.refresh(None, None, request)  # the owner's list, which the picker's actions look up
        said = ""
        for said in self.picker.download(pick.fit.entry.id, request):
            yield said
        if said.startswith(_DOWNLOADED):  # whole: a cancelled download leaves a snapshot folder that serves nothing
            with self._lock:
                self._ready.add((_tab(request), pick.fit.entry.id))

    def serve(self, request: gr.Request = None) -> tuple[object, dict, str]:
        """After the download: the pick served through the picker, and the card again (hidden once it is served).
        A refused, cancelled or failed download leaves its own message and serves nothing."""
        pick = self.pick()
        with self._lock:
            ready = pick is not None and (_tab(request), pick.fit.entry.id) in self._ready
            self._ready.discard((_tab(request), pick.fit.entry.id) if pick is not None else None)
        if not ready or not self.picker.owner.is_owner(request):
            return (gr.skip(), *self.show())
        message = self.picker.serve(pick.fit.entry.id, request)
        return (message, *self.show())

    def cancel(self, request: gr.Request = None) -> None:
        self.picker.cancel(request)

    def build(self, demo: gr.Blocks) -> None:
        """Adds the card where it is called (inside ``demo``): hidden until the page's load finds it worth showing."""
        with gr.Column(visible=False, elem_id="first-pick") as group:
            facts = gr.HTML(elem_id="first-pick-facts")
            with gr.Row(elem_classes="button-row"):
                fetch = gr.Button("Download and serve", variant="primary", size="sm", elem_id="first-pick-fetch")
                cancel = gr.Button("Cancel download", size="sm", elem_id="first-pick-cancel")
        note = gr.HTML(elem_id="first-pick-status")
        seen = gr.State(None)  # the served model this tab's card was made for
        card = [seen, group, facts]
        # After the page is shown, never before it: the probe and the planning run in the load event's worker.
        demo.load(self.shown, None, card, api_visibility="private", concurrency_limit=None, show_progress="hidden")
        gr.Timer(FOLLOW_SECONDS).tick(self.follow, [seen], card, api_visibility="private", concurrency_limit=None,
                                      show_progress="hidden")
        fetch.click(self.download, None, [note], api_visibility="private", concurrency_id="download",
                    concurrency_limit=1).then(self.serve, None, [note, group, facts], api_visibility="private",
                                              concurrency_id="compute", concurrency_limit=1)
        cancel.click(self.cancel, None, None, api_visibility="private", concurrency_limit=None)
