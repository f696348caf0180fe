"""The KV core: homes per (layer, head group), host memory, transfers, the overlap schedule, the kernels.

Nothing here imports the layers above (cache, attention, session): they use these pieces.
"""

from .homes import GroupHome, HeadGroup, LayerHomes
from .host_attention import HostAttention
from .pinned import HostMemory
from .schedule import Schedule, visible_start
from .transfer import Transfer

__all__ = ["GroupHome", "HeadGroup", "HostAttention", "HostMemory", "LayerHomes", "Schedule", "Transfer",
           "visible_start"]
