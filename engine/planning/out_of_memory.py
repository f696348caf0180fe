"""What a user reads when a forward runs out of memory anyway (another program took the GPU, or a plan was off).

The session has already given the chunk back (its document and conversation are as they were), so the message
says that, and names the settings that lower the memory a read or an answer takes.
"""

from __future__ import annotations


def out_of_memory_message(num_tokens: int, device_type: str, error: BaseException) -> str:
    """One paragraph: what failed, that nothing was lost, and what to change."""
    what = getattr(error, "category", None)  # the ledger's category, when the refusal came from its allocation point
    where = f" (allocating {what})" if what else ""
    if device_type == "cuda":
        change = ("close other programs using the GPU (another browser tab reading a document counts), or lower "
                  "--gpu-memory, --head-group or --chunk-size")
    else:
        change = ("close other programs, or lower --host-memory or --chunk-size, or store the KV in 8 bits "
                  "(--kv-8bit int8)")
    return (f"out of memory while processing {num_tokens:,} tokens{where}. The document and the conversation are "
            f"kept; ask again, or to make room {change}. ({error})")
