"""The model's trained context window: past it a model's answers degrade, usually into nonsense, however
much memory is free, so the planner caps a document's context there (``OffloadPolicy.exceed_trained_window``
lifts the cap)."""

from __future__ import annotations


def trained_window(config) -> int | None:
    """The most tokens the model was trained (or RoPE-scaled) to attend over; None when the config does not say.

    ``max_position_embeddings``, widened by a RoPE-scaling entry that extends it: ``factor`` times
    ``original_max_position_embeddings`` (YaRN, Llama 3, LongRoPE), or times ``max_position_embeddings``
    for YaRN and dynamic NTK without an original length. Linear scaling configs already state the scaled
    length in ``max_position_embeddings``.
    """
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    window = getattr(config, "max_position_embeddings", None)
    if not isinstance(window, int) or window < 1:
        return None
    for params in _rope_parameter_sets(config):
        factor, original = params.get("factor"), params.get("original_max_position_embeddings")
        kind = params.get("rope_type") or params.get("type")
        if isinstance(factor, (int, float)) and factor > 1:
            if isinstance(original, int) and original > 0:
                window = max(window, int(factor * original))
            elif kind in ("yarn", "dynamic"):
                window = max(window, int(factor * config.max_position_embeddings))
    return window


def _rope_parameter_sets(config) -> list[dict]:
    """The RoPE parameter dicts: ``rope_parameters`` (transformers 5, maybe one per layer type) or ``rope_scaling``."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return []
    nested = [value for value in params.values() if isinstance(value, dict)]
    return nested or [params]
