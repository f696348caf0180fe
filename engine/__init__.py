"""HeadInfer engine: exact head-wise KV-cache offload for stock transformers models.

Importing this package registers the attention implementation ``"headinfer"`` with transformers.
"""

from . import attention as _attention
from .answer.generate import QuestionTooLong
from .cache import HeadInferCache
from .models.loader import ModelSourceError, UnsupportedModelError, describe, load_model
from .planning.memory import ModelShape, Plan, PlanError, make_plan, paper_memory_table
from .planning.policy import OffloadPolicy
from .prompt import DocumentTokens
from .reports import AnswerChunk, PrefillCancelled, PrefillProgress
from .answer.sampling import RepetitionGuard
from .answer.sources import Source
from .session import DocumentSession
from .planning.machine import MemorySnapshot, format_bytes, read_memory
from .store.snapshots import CorruptSnapshotError, RestoreStats, SnapshotError, SnapshotInfo, SnapshotStore

_attention.register()

__all__ = [
    "AnswerChunk",
    "RepetitionGuard",
    "Source",
    "DocumentSession",
    "DocumentTokens",
    "PrefillCancelled",
    "PrefillProgress",
    "UnsupportedModelError",
    "describe",
    "format_bytes",
    "load_model",
    "CorruptSnapshotError",
    "RestoreStats",
    "SnapshotError",
    "SnapshotInfo",
    "SnapshotStore",
    "HeadInferCache",
    "MemorySnapshot",
    "ModelSourceError",
    "ModelShape",
    "OffloadPolicy",
    "Plan",
    "PlanError",
    "QuestionTooLong",
    "make_plan",
    "paper_memory_table",
    "read_memory",
]
