"""Models: loading one (``load_model``), checking it can be served exactly, the curated catalogue and what each
entry reads on this machine (from its config alone), models found on this machine and Hub downloads. Switching the
served model is ``engine.ModelHolder`` (``engine/serving.py``, above the session). The app's picker and ``launch.py``
use these names; the rest of the folder is internal."""

from ..planning.window import trained_window
from .catalogue import (READ_TOKENS, Entry, Fit, Machine, detect_machine, fit_weights_label, load_catalogue,
                        plan_entry, rank)
from .discovery import discover
from .downloads import DownloadJob, DownloadProgress, cached_snapshot, pin_status, update_pin
from ..errors import ModelSourceError, UnsupportedModelError
from .loader import (
                     check_supported,
                     describe,
                     kv_head_counts,
                     load_model,
                     read_config,
                     resolve_device,
)
from .pypi import cpu_default_source, default_source, pypi_model_gguf
from .token_count import TokenCount, count_tokens

__all__ = ["READ_TOKENS", "DownloadJob", "DownloadProgress", "Entry", "Fit", "Machine", "ModelSourceError",
           "UnsupportedModelError", "cached_snapshot", "check_supported", "cpu_default_source", "default_source",
           "describe", "detect_machine", "discover", "fit_weights_label", "kv_head_counts", "load_catalogue", "load_model", "plan_entry",
           "pin_status", "pypi_model_gguf", "update_pin",
           "rank", "read_config", "resolve_device", "TokenCount", "count_tokens", "trained_window"]
