"""The model's trained context window: past it a model's answers degrade, usually into nonsense, however
much memory is free, so the planner caps a document's context there (``OffloadPolicy.exceed_trained_window``
lifts the cap)."""

from __future__ import annotations

MAX_CONVERSATION = 4096  # tokens of answer and earlier turns a document's plan keeps beside it, at most
CONVERSATION_SHARE = 4  # ... and at most a quarter of the window: an 8K model still reads a 6K-token document


def trained_window(config) -> int | None:
    """The most tokens the model was trained (or RoPE-scaled) to attend over; None when the config does not say.

    ``max_position_embeddings``, widened by a RoPE-scaling entry that extends it: ``factor`` times
    ``original_max_position_embeddings`` (YaRN, LongRoPE), or times ``max_position_embeddings`` for YaRN and
    dynamic NTK without an original length. Linear and Llama 3 scaling configs already state the scaled length
    in ``max_position_embeddings`` (Llama 3.2's factor 32 x 8,192 = 262,144 is not its 131,072-token window).
    """
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    window = getattr(config, "max_position_embeddings", None)
    if not isinstance(window, int) or window < 1:
        return None
    for params in _rope_parameter_sets(config):
        factor, original = params.get("factor"), params.get("original_max_position_embeddings")
        kind = params.get("rope_type") or params.get("type")
        if kind in _STATED:
            continue
        if isinstance(factor, (int, float)) and factor > 1:
            if isinstance(original, int) and original > 0:
                window = max(window, int(factor * original))
            elif kind in ("yarn", "dynamic"):
                window = max(window, int(factor * config.max_position_embeddings))
    return window


#: RoPE types whose configs state the scaled window in ``max_position_embeddings`` themselves.
_STATED = ("linear", "llama3")


def degrades_past(config) -> int | None:
    """Tokens past which the model's own card says plain attention loses accuracy, or None: a config with a
    ``dual_chunk_attention_config`` (Qwen2.5-1M) was trained to read past its chunk (262,144) with Dual Chunk
    Attention, which the engine does not run; it reads on with full attention, exactly, but answers degrade there."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    dual = getattr(config, "dual_chunk_attention_config", None)
    if not isinstance(dual, dict):
        return None
    chunk = dual.get("chunk_size") or dual.get("original_max_position_embeddings")
    return int(chunk) if isinstance(chunk, int) and chunk > 0 else None


def _rope_parameter_sets(config) -> list[dict]:
    """The RoPE parameter dicts: ``rope_parameters`` (transformers 5, maybe one per layer type) or ``rope_scaling``."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return []
    nested = [value for value in params.values() if isinstance(value, dict)]
    return nested or [params]


def conversation_allowance(window: int | None) -> int:
    """Tokens of the window a document's plan keeps for the conversation (the answer and earlier turns): a quarter
    of ``window``, at most ``MAX_CONVERSATION`` (all of it without a stated window)."""
    if window is None:
        return MAX_CONVERSATION
    return max(min(MAX_CONVERSATION, window // CONVERSATION_SHARE), 1)
