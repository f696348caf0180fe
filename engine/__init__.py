"""HeadInfer engine: exact head-wise KV-cache offload for stock transformers models.

The public API is the fifteen names below; the data types its calls hand back are in ``engine.types``, and the model
catalogue, discovery and downloads (the app's picker) in ``engine.models``. Everything else is internal.

Importing this package registers the attention implementation ``"headinfer"`` with transformers.
"""

from . import attention as _attention
from .answer.generate import warm_up
from .cache import HeadInferCache
from .errors import HeadInferError, PlanError, PrefillCancelled, QuestionTooLong
from .kv.native import build_host_kernel
from .models.loader import load_model
from .planning.machine import format_bytes, read_memory
from .planning.planner import make_plan
from .planning.policy import OffloadPolicy
from .serving import ModelHolder
from .session import DocumentSession
from .store.snapshots import SnapshotStore

_attention.register()

__all__ = [
    "DocumentSession",
    "HeadInferCache",
    "HeadInferError",
    "ModelHolder",
    "OffloadPolicy",
    "PlanError",
    "PrefillCancelled",
    "QuestionTooLong",
    "SnapshotStore",
    "build_host_kernel",
    "format_bytes",
    "load_model",
    "make_plan",
    "read_memory",
    "warm_up",
]
