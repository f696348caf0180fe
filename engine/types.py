"""The data the public API exchanges (``engine.__all__``'s calls): documents and their page markers, progress, answers,
plans, snapshots, memory readings. A caller reads these; it never builds the engine's internals from them."""

from .answer.sampling import RepetitionGuard
from .answer.sources import Source
from .answer.support import Support
from .planning.machine import MemorySnapshot
from .planning.plan import Plan
from .planning.shape import ModelShape
from .prompt import DocumentTokens, PageMarker, page_marker, page_markers
from .reports import AnswerChunk, PrefillProgress
from .store.checkpoint import CheckpointPlan
from .store.snapshots import RestoreStats, SnapshotInfo

__all__ = ["AnswerChunk", "CheckpointPlan", "DocumentTokens", "MemorySnapshot", "ModelShape", "PageMarker", "Plan",
           "PrefillProgress", "RepetitionGuard", "RestoreStats", "SnapshotInfo", "Source", "Support", "page_marker",
           "page_markers"]
