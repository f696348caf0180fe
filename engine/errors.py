"""Every error the engine raises on purpose, under one root: ``HeadInferError``.

A caller catches ``HeadInferError`` for "the engine refused or could not do this, with a message for the user", and
anything else is a bug that should surface. Each class also keeps the builtin base it had before the root existed
(``ValueError``, ``OSError``, ``RuntimeError``, ``MemoryError``), so an ``except`` written against that still works.

This module imports nothing: every wing (``kv/`` included) may raise these without importing anything above it.
"""

from __future__ import annotations


class HeadInferError(Exception):
    """The root: the engine refused a request or could not complete it, and says why."""


# -- the caller's side -----------------------------------------------------------------------------------------
class InputError(HeadInferError, ValueError):
    """Bad input: an empty document or question, an invalid option value."""


class StateError(HeadInferError, ValueError):
    """A call in the wrong state: asking before a document was read, saving before it was prefilled."""


# -- planning ----------------------------------------------------------------------------------------------------
class PlanError(HeadInferError, ValueError):
    """A run cannot be planned (bad input) or does not fit its memory budgets."""


class PinningError(PlanError):
    """Page-locking host memory for the KV cache was refused."""


class QuestionTooLong(PlanError):
    """A question that cannot fit the model's window (or the memory plan) next to the document and its answer;
    refused before any work, its message carries the numbers."""

    def __init__(self, message: str, *, question_tokens: int, room: int):
        super().__init__(message)
        self.question_tokens, self.room = question_tokens, room


# -- reading and answering ---------------------------------------------------------------------------------------
class PrefillCancelled(HeadInferError):
    """Raised by ``prefill`` when ``should_stop`` turned true; the cache ends at a chunk boundary."""


class ForwardInterrupted(HeadInferError):
    """``should_stop`` turned true during a forward pass guarded by ``interrupt.interruptible``."""


class RouteError(HeadInferError, RuntimeError):
    """The attention function could not be matched with the cache layer that produced its key states."""


class HomesFull(HeadInferError, MemoryError):
    """A GPU-resident home would have to grow past the capacity the plan fixed for it."""


# -- the disk tier and snapshots --------------------------------------------------------------------------------
class DiskTierError(HeadInferError, OSError):
    """The disk tier could not be set up or grown (no space, a missing or read-only folder)."""


class DiskStreamError(HeadInferError, OSError):
    """A disk-tier job was refused because an earlier one failed (its error is the cause)."""


class SnapshotError(HeadInferError, ValueError):
    """A snapshot cannot be restored into this session; the message says why."""


class CorruptSnapshotError(SnapshotError):
    """A snapshot's files are damaged (truncated, altered, unreadable): it can never load and may be deleted."""


class ChecksumMismatch(HeadInferError):
    """A file's bytes do not hash to the expected CRC-32."""


class TruncatedFile(HeadInferError):
    """A file ended before the bytes it should hold."""


# -- models -----------------------------------------------------------------------------------------------------
class ModelSourceError(HeadInferError, OSError):
    """The model source could not be found or read (missing path, unreachable Hub, bad file)."""


class CorruptDownload(ModelSourceError):
    """A downloaded file does not match the SHA-256 the Hub lists for it (it was removed from the cache)."""


class GatedModelError(ModelSourceError):
    """The repository is gated or private and this machine is not logged in with access to it."""


class DamagedRevisionLock(ModelSourceError):
    """The lock file recording the Hub commit each model was pinned to (``engine.models.hub_lock``) cannot be read:
    downloads and cached lookups of unpinned models stop rather than fall back to a branch."""


class RevisionLockMismatch(ModelSourceError):
    """The Hub's answer at a locked commit differs from what this machine recorded at the first download."""


class UnsupportedModelError(HeadInferError, ValueError):
    """The model's architecture is not one the head-wise engine supports. ``supported`` maps each supported
    ``model_type`` to its display name (``engine.models.loader.SUPPORTED_ARCHITECTURES``; passed in, since this
    module imports nothing)."""

    def __init__(self, model_type: str | None, detail: str = "", *, supported: dict[str, str] | None = None) -> None:
        self.model_type = model_type
        names = "; ".join(f"{key} ({name})" for key, name in (supported or {}).items())
        super().__init__(f"Unsupported model architecture {model_type or 'unknown'!r}{detail}. "
                         f"HeadInfer Studio supports: {names}.")


class GGUFHeaderError(HeadInferError, ValueError):
    """Not a GGUF file, or one whose header is cut short or malformed."""


class StaleWeightsCache(HeadInferError, ValueError):
    """A saved weights-cache entry does not match the model it is loaded into (another layout or cache format);
    the loader reads the source again instead."""


class DownloadCancelled(HeadInferError):
    """``DownloadJob.cancel`` was called; the files finished so far stay in the cache."""


# -- serving ---------------------------------------------------------------------------------------------------
class SwitchFailed(HeadInferError, RuntimeError):
    """A switch that unloaded the served model first could not load the new one; the message says whether the old
    one is served again or no model is."""


# -- checks ------------------------------------------------------------------------------------------------------
class RaceError(HeadInferError, RuntimeError):
    """Two conflicting accesses to the same bytes that no event, stream order or join orders."""


__all__ = ["HeadInferError", "InputError", "StateError", "PlanError", "PinningError", "PrefillCancelled", "ForwardInterrupted", "RouteError", "HomesFull", "DiskTierError", "DiskStreamError", "SnapshotError", "CorruptSnapshotError", "ChecksumMismatch", "TruncatedFile", "ModelSourceError", "CorruptDownload", "GatedModelError", "DownloadCancelled", "RaceError", "SwitchFailed"]
