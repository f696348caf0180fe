"""HeadInfer engine: exact head-wise KV-cache offload for stock transformers models.

Importing this package registers the attention implementation ``"headinfer"`` with transformers.
"""

from . import attention as _attention
from .cache import HeadInferCache
from .planner import ModelShape, Plan, PlanError, make_plan, paper_memory_table
from .policy import OffloadPolicy
from .session import AnswerChunk, DocumentSession, PrefillCancelled, PrefillProgress

_attention.register()

__all__ = [
    "AnswerChunk",
    "DocumentSession",
    "PrefillCancelled",
    "PrefillProgress",
    "HeadInferCache",
    "ModelShape",
    "OffloadPolicy",
    "Plan",
    "PlanError",
    "make_plan",
    "paper_memory_table",
]
