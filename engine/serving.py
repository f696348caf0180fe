"""The model the running app serves, and switching it: the old model's memory is given back, open documents close.

``ModelHolder.new_session`` is the app's session factory. ``switch`` first asks whether the new model's weights fit
beside the served one (``order_for``: the picker's planned weight bytes against free device memory, or available
RAM, less the plan's reserve). Where they fit it loads the new model first (a failed load leaves the old one
serving), then retires every live session of the old one: its KV is freed, its model and tokenizer references are
dropped and ``retired`` says why, so the app can tell the tab and start it afresh. Where they do not (two 27B models
on one consumer card), it retires the sessions and frees the old model first, then loads; a failed load loads the old
model back from its source, and if that fails too no model is served (``new_session`` says how to pick one). Saved
documents need nothing: a snapshot's identity includes the model that read it (``engine.store.fingerprint``), so each
stays tied to its model and reopens only under it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from .errors import StateError, SwitchFailed
from .interrupt import stop_on_ctrl_c
from .models.loader import describe
from .models.memory import release_memory
from .models.weights_mode import loaded_as
from .planning.budgets import gpu_budget
from .planning.machine import HOST_BUDGET_FRACTION
from .planning.policy import OffloadPolicy
from .session import DocumentSession

logger = logging.getLogger(__name__)

NO_MODEL = "No model is served"
HOW_TO_PICK = "open “Models” at the bottom of the page, pick a model and press “Serve this model”"


@dataclass(frozen=True)
class SwitchOrder:
    """Whether the new weights fit beside the served model's: ``needed`` bytes against ``room``."""

    needed: int | None  # the new model's weights as held (the picker's ``Fit.weights_bytes``); None: not known
    room: int  # free device memory (CUDA) or available RAM, less the plan's reserve and the open documents' KV to come

    @property
    def fits(self) -> bool:
        return self.needed is None or self.needed <= self.room


@dataclass(frozen=True)
class SwitchReport:
    old: str
    new: str
    closed_documents: int  # sessions that had a document open
    rss_before: int  # bytes, this process, before the old model and its sessions were released
    rss_after: int  # after they were released (and, loading first, with the new model loaded)
    load_seconds: float
    unloaded_first: bool = False  # the new model did not fit beside the old: the old was freed before the load

    @property
    def returned_bytes(self) -> int:
        return max(self.rss_before - self.rss_after, 0)


class ModelHolder:
    """Owns the served ``(model, tokenizer)``; every session the app uses comes from ``new_session``.

    ``source``: what the loader takes to load the served model again (default: how ``load_model`` loaded it, else
    ``name``). ``free_memory(device)``: bytes free now on the device (CUDA: ``mem_get_info`` plus the allocator's
    unused cache; a CPU: available RAM), before the reserve; a stand-in in tests."""

    def __init__(self, model: Any, tokenizer: Any, policy: OffloadPolicy, name: str,
                 loader: Callable[[str | None], tuple[Any, Any]] | None = None, *, source: str | None = ...,
                 free_memory: Callable[[torch.device], int] | None = None):
        self.model, self.tokenizer, self.policy, self.name = model, tokenizer, policy, name
        self.source = _source_of(model, name) if source is ... else source
        self.device = next(model.parameters()).device
        self._loader = loader
        self._free_memory = free_memory or free_device_memory
        self.serial = 0  # counts switches: what the app compares to notice one
        self._info: tuple[int, dict] | None = None
        self._sessions: weakref.WeakSet[DocumentSession] = weakref.WeakSet()
        self._unserved = ""  # why no model is served, once none is
        self._lock = threading.Lock()

    def new_session(self) -> DocumentSession:
        with self._lock:
            if self.model is None:
                raise StateError(f"{NO_MODEL}: {self._unserved}; {HOW_TO_PICK}.")
            session = DocumentSession(self.model, self.tokenizer, self.policy)
            session.retired = None  # set to a note when the model it reads with is switched away
            self._sessions.add(session)
            return session

    @staticmethod
    def stop_on_ctrl_c(wait_seconds: float = 120.0):
        """The app serving inside the ``with``: Ctrl+C stops every read and answer at its next layer, each read keeping
        a checkpoint of what it read, and leaving it waits for them (``interrupt.stop_on_ctrl_c``)."""
        return stop_on_ctrl_c(wait_seconds)

    def info(self) -> dict:
        """``describe`` of the served model with its ``serial``, computed once per model; with no model served, its
        ``model_name`` says so and how to pick one."""
        with self._lock:
            if self._info is None or self._info[0] != self.serial:
                about = (describe(self.model) if self.model is not None else
                         {"model_name": f"{NO_MODEL}: {HOW_TO_PICK}", "served": False})
                self._info = (self.serial, {**about, "serial": self.serial})
            return self._info[1]

    def order_for(self, weights_bytes: int | None) -> SwitchOrder:
        """Whether a model of ``weights_bytes`` (as held) fits beside the served one now (``SwitchOrder``)."""
        if self.device.type == "cuda":
            room = gpu_budget(self._free_memory(self.device), 0, self.policy.gpu_reserve)
        else:
            room = int(self._free_memory(self.device) * HOST_BUDGET_FRACTION)
        return SwitchOrder(weights_bytes, max(0, room - self._kv_to_come()))

    def _kv_to_come(self) -> int:
        """KV the open documents are planned for but have not allocated yet (a cache allocates on its first chunk;
        what it holds is already out of the free reading), on the device the weights would load to."""
        with self._lock:
            sessions = [s for s in self._sessions if s.cache is not None]
        to_come = 0
        for session in sessions:
            plan, held = session.cache.plan, session.cache.kv_bytes()
            planned = (plan.gpu_bytes if plan.device_is_cuda else plan.host_bytes) - session.shape.weights_bytes
            to_come += max(0, planned - held["device"] - (0 if plan.device_is_cuda else held["host"]))
        return to_come

    def switch(self, source: str | None, name: str | None = None, *, weights_bytes: int | None = None) -> SwitchReport:
        """Loads ``source`` (as ``load_model`` takes it) and makes it the served model. ``weights_bytes``: its weights
        as held, as the picker planned them (``Fit.weights_bytes``); None keeps the old model until the new loads.

        Beside the old model (it fits, or nothing says otherwise): raises whatever the loader raises (unsupported,
        missing, gated) and the old model keeps serving. Unloading the old first: raises ``SwitchFailed``, saying
        whether the old model is served again or none is.
        """

        if self._loader is None:
            raise RuntimeError("this holder was made without a loader")
        new_name = name or source or "embedded model"
        order = self.order_for(weights_bytes)
        if self.model is None or not order.fits:
            return self._switch_unloading_first(source, new_name, order)
        started = time.perf_counter()
        model, tokenizer = self._loader(source)
        load_seconds = time.perf_counter() - started
        rss_before = _rss()
        old_name = self.name
        closed, _ = self._replace(model, tokenizer, source, new_name,
                                  f"The model was switched from {old_name} to {new_name}: open documents were "
                                  f"closed. Documents saved with {old_name} stay tied to it and reopen when it is "
                                  f"served again.")
        del model, tokenizer
        release_memory()
        report = SwitchReport(old_name, new_name, closed, rss_before, _rss(), load_seconds)
        logger.info("switched %s -> %s: %.2f GiB returned", old_name, new_name, report.returned_bytes / 2**30)
        return report

    def _switch_unloading_first(self, source: str | None, new_name: str, order: SwitchOrder) -> SwitchReport:
        """The old model and its sessions are freed before ``source`` loads, so at most one model is alive."""
        old_name, old_source, was_serving = self.name, self.source, self.model is not None
        if was_serving:
            logger.info("%s (%s) does not fit beside %s (%s free): unloading it first", new_name,
                        _gib(order.needed), old_name, _gib(order.room))
        rss_before = _rss()
        closed, retired = self._replace(None, None, None, "",
                                        f"{old_name} was unloaded to load {new_name}: open documents were closed.")
        release_memory()
        rss_after = _rss()
        started = time.perf_counter()
        try:
            model, tokenizer = self._loader(source)
        except Exception as error:  # unsupported, missing, gated, out of memory: the old one is loaded back
            if was_serving:
                note = self._load_back(old_name, old_source, new_name, error)
            else:
                self._unserved = f"{new_name} could not be loaded ({error})"
                note = f"could not load {new_name}: {error}; {NO_MODEL.lower()}: {HOW_TO_PICK}"
            for session in retired:
                session.retired = f"{note[0].upper()}{note[1:]}. Open documents were closed; read them again."
            raise SwitchFailed(note) from error
        load_seconds = time.perf_counter() - started
        self._replace(model, tokenizer, source, new_name, "")
        del model, tokenizer
        report = SwitchReport(old_name, new_name, closed, rss_before, rss_after, load_seconds, unloaded_first=True)
        logger.info("switched %s -> %s, unloading first: %.2f GiB returned", old_name, new_name,
                    report.returned_bytes / 2**30)
        return report

    def _load_back(self, old_name: str, old_source: str | None, new_name: str, error: Exception) -> str:
        """Loads the unloaded model again after ``new_name`` failed; returns what happened, in the user's words."""
        logger.warning("could not load %s (%s): loading %s back", new_name, error, old_name)
        try:
            model, tokenizer = self._loader(old_source)
        except Exception as again:  # both failed: the app stays up serving no model
            logger.error("could not load %s back either: %s", old_name, again)
            self._unserved = f"{new_name} could not be loaded ({error}), nor {old_name} again ({again})"
            return (f"could not load {new_name}: {error}; loading {old_name} back failed too: {again}. "
                    f"{NO_MODEL}: {HOW_TO_PICK}")
        self._replace(model, tokenizer, old_source, old_name, "")
        return f"could not load {new_name}: {error}; {old_name} is served again"

    def _replace(self, model: Any, tokenizer: Any, source: str | None, name: str,
                 note: str) -> tuple[int, list[DocumentSession]]:
        """Makes ``model`` the served one (None: none) under a new ``serial`` and retires every live session of the
        one before with ``note``, in one step: no session can be opened on a model being let go. Returns how many
        had a document open, and them."""
        with self._lock:
            retired, self._sessions = list(self._sessions), weakref.WeakSet()
            closed = sum(1 for session in retired if session.document)
            for session in retired:
                retire(session, note)
            self.model, self.tokenizer, self.source, self.name = model, tokenizer, source, name
            self._unserved = "the last switch left none loaded"
            self.serial += 1
        return closed, retired


def retire(session: DocumentSession, note: str) -> None:
    """Frees the session's KV and drops its references to the model, so the model can be freed."""
    try:
        session.clear()
    except Exception:  # a session mid-way through a cancelled read: what matters is letting go of the model
        logger.exception("clearing a retired session failed")
    session.retired = note
    session.model = session.tokenizer = None
    session.prompts = None
    session.read_time = None  # its read estimates (engine.read_time) hold the model too


def free_device_memory(device: torch.device) -> int:
    """Bytes free on ``device`` now: CUDA's free memory plus the allocator's unused cache (reusable by a load);
    a CPU's available RAM."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return psutil.virtual_memory().available


def _source_of(model: Any, name: str) -> str | None:
    loaded = loaded_as(model)
    return loaded["source"] if loaded is not None and "source" in loaded else name


def _gib(size: int | None) -> str:
    return "size not known" if size is None else f"{size / 2**30:.2f} GiB"


def _rss() -> int:
    return psutil.Process().memory_info().rss
