"""The loader's tiny model shapes: the text models' and a multimodal Gemma 3 checkpoint's (a vision tower beside a
text model), for the loader's and the weights cache's tests."""

VOCAB = 128
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=256)


def tiny_gemma3_multimodal_config():
    """A multimodal Gemma 3 checkpoint's config, tiny: a vision tower beside a text model of ``TINY``'s shape."""
    from transformers import Gemma3Config

    return Gemma3Config(
        text_config={**TINY, "vocab_size": VOCAB + 4, "sliding_window": 8},
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, boi_token_index=VOCAB + 1, eoi_token_index=VOCAB + 2, image_token_index=VOCAB + 3,
    )
