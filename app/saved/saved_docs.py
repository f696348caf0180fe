"""Saved documents: reopen a document set from its KV-cache snapshot on disk instead of reading it
again, save it after a complete read, and list or delete what is saved.

One ``engine.SnapshotStore`` is shared by every browser tab. Saving and restoring run inside the read
event, which holds the device, so they never overlap a forward pass. Listing and deleting are
light: a snapshot deleted while another tab restores it only makes that tab read the document instead.
Every disk failure becomes a sentence for the status line; none of them unloads a document.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
from dataclasses import dataclass

from app.saved import store_owner
from app.documents import Document
from engine import DocumentSession, HeadInferError, SnapshotStore, format_bytes
from engine.types import CheckpointPlan, RestoreStats, SnapshotInfo

logger = logging.getLogger(__name__)

SHELF_FILE = "studio-documents.json"  # beside the KV in the snapshot's folder: deleted with it
CHECKPOINT_EVERY_CHUNKS = 16  # a read in progress is checkpointed this often (or every 2 minutes) onto the shelf


@dataclass(frozen=True)
class ShelfEntry:
    """What reopening a saved document needs besides its KV: the exact text read (re-tokenized, it gives the
    snapshot's ids) and the files it came from (the files table, the page map, the viewer)."""

    text: str
    documents: tuple[Document, ...]

    def to_json(self) -> str:
        return json.dumps({"version": 1, "text": self.text,
                           "documents": [dataclasses.asdict(doc) for doc in self.documents]})

    @classmethod
    def from_json(cls, data: str) -> ShelfEntry:
        raw = json.loads(data)
        fields = {field.name for field in dataclasses.fields(Document)}
        documents = tuple(Document(**{k: v for k, v in doc.items() if k in fields}) for doc in raw["documents"])
        return cls(raw["text"], documents)


class SavedDocs:
    """The app's view of the snapshot store; ``store=None`` (``--no-kv-cache``) turns it all off."""

    def __init__(self, store: SnapshotStore | None, *, cap_note: str = "allowed for saved documents"):
        self.store, self.cap_note = store, cap_note  # cap_note: whose cap it is, said when a save is over it
        if store is not None:
            store_owner.claim(store.root)  # what a killed save left goes now, unless a live app still owns it

    @property
    def enabled(self) -> bool:
        return self.store is not None

    @property
    def cap(self) -> int | None:
        return self.store.max_bytes if self.store is not None else None

    # -- reading -----------------------------------------------------------------------------------
    def find(self, session: DocumentSession) -> SnapshotInfo | None:
        """The snapshot saved for the session's document, if any (damaged ones too: restoring deletes them)."""
        try:
            return session.find_snapshot(self.store)
        except OSError as exc:  # an unreadable cache folder only means reading the slow way
            logger.warning("could not look for a saved copy: %s", exc)
            return None

    def restore(self, session: DocumentSession) -> RestoreStats | None:
        """Fills the session's cache from disk; None when nothing usable was there (the caller reads)."""
        try:
            return session.restore_snapshot(self.store)
        except (OSError, HeadInferError) as exc:  # restore_snapshot catches most; a refusal or the disk here
            logger.warning("could not reopen the saved copy: %s", exc)
            return None

    def save(self, session: DocumentSession, label: str, documents: tuple[Document, ...] = ()) -> tuple[str, str]:
        """Saves the prefilled document, with the text and ``documents`` it was read from (so that it reopens
        from the list with no upload); returns (``ok | warn | error``, a sentence for the status line).

        ``warn``: larger than the store's cap, so not saved; ``error``: the disk failed (or is full).
        """
        try:
            # The shelf's text is saved inside the snapshot, fsynced before its rename: a listed snapshot has it.
            shelf = ((SHELF_FILE, ShelfEntry(session.document, tuple(documents)).to_json()),)
            info = session.save_snapshot(self.store, label, sidecar=shelf)
        except (OSError, HeadInferError) as exc:
            logger.warning("could not save the document's KV cache: %s", exc)
            return "error", (f"Could not save it for instant reopening ({disk_reason(exc)}); "
                             "the documents stay loaded.")
        if info is None:
            return "warn", (f"Not saved for instant reopening: it would take more than the "
                            f"{format_bytes(self.cap)} {self.cap_note}.")
        return "ok", f"Saved for instant reopening ({format_bytes(info.num_bytes)})."

    def checkpoints(self, session: DocumentSession, label: str,
                    documents: tuple[Document, ...] = ()) -> CheckpointPlan | None:
        """How a read checkpoints onto this shelf as it goes (None when saving is off), with its text and files
        beside the K/V so that a read cut short by a crash or a restart shows up here and continues."""
        if self.store is None:
            return None
        return CheckpointPlan(self.store, every_chunks=CHECKPOINT_EVERY_CHUNKS, label=label,
                              sidecar=((SHELF_FILE, ShelfEntry(session.document, tuple(documents)).to_json()),))

    def entry(self, key: str) -> ShelfEntry | None:
        """The text and files saved beside snapshot ``key``; None when there are none (saved before the shelf
        kept them, or deleted meanwhile)."""
        if self.store is None or not key:
            return None
        try:
            folder = self.store.root / key
            if not folder.resolve().is_relative_to(self.store.root.resolve()):
                return None
            return ShelfEntry.from_json((folder / SHELF_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.info("no reopenable text beside saved document %s: %s", key, exc)
            return None

    # -- the panel ---------------------------------------------------------------------------------
    def leftover_bytes(self) -> int:
        """Bytes interrupted saves left on disk (removed at the next start when no live app owns them)."""
        return store_owner.leftover_bytes(self.store.root) if self.store is not None else 0

    def list(self) -> tuple[list[SnapshotInfo], str | None]:
        """The saved snapshots, most recently used first, and a problem to show instead, if any."""
        if self.store is None:
            return [], None
        try:
            return self.store.list(), None
        except OSError as exc:  # e.g. the folder was removed, or a snapshot vanished while being listed
            logger.warning("could not list saved documents: %s", exc)
            return [], f"Could not list saved documents: {disk_reason(exc)}."

    def delete(self, key: str | None) -> tuple[bool, str]:
        """Deletes one snapshot by key; returns (deleted, a sentence for the status line)."""
        if not key:
            return False, "Choose a saved document to delete first."
        infos, problem = self.list()
        info = next((info for info in infos if info.key == key), None)
        if info is None:
            return False, problem or "That saved document is no longer on disk."
        try:
            self.store.delete(key)
        except OSError as exc:
            logger.warning("could not delete snapshot %s: %s", key, exc)
            return False, f"Could not delete “{info.label}”: {disk_reason(exc)}."
        return True, f"Deleted “{info.label}” ({format_bytes(info.num_bytes)}) from disk."


def disk_reason(exc: BaseException) -> str:
    """A short reason for a disk error: ``"the disk is full"``, ``"Permission denied: /path"``…"""
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"the disk is full: {exc.strerror}" if exc.strerror else "the disk is full"
        if exc.strerror:
            return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__
