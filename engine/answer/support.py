"""Whether the document supports an answer: "the document may not say this".

Three signals the engine already holds after an answer, so the check costs a few reductions:

- ``document_share``: of the attention the answer's retrieval heads paid (``sources.attention_mass``), the share
  that landed on the document's pages rather than on the system prompt, the question and the answer itself. An
  answer read off a page looks at the page; an invented one looks at the question and at what it wrote.
- ``mean_logprob``: the mean log-probability the model gave the tokens it wrote (from the logits the decode
  computed anyway). An invented default or version number is written with less confidence than a copied one.
- ``grounded_share``: the share of the answer's own content words (those not already in the question) that are
  on the pages it attended to (its sources). An answer read off its pages repeats their words; an invented option,
  program or number is on none of them.
- ``claim_logprob``: the mean log-probability of the answer's claim tokens only (``claim_tokens``: its own content
  words, not the question it restates), from the same per-token log-probs. The restated question is written surely
  over an invented claim as over a copied one and dilutes ``mean_logprob``; the claim's own tokens do not.

- ``asked_share``: the share of the question's own content words (each reduced to a crude stem, so "opens" meets
  "open") that the document uses anywhere (``document_words``). A question about another program, system or
  feature names it, and a document that never names it cannot answer it: the answer then restates the question
  around an invented claim (the model signals catch an invented default for a setting the document does discuss;
  this one catches the question the document is not about, whatever the model wrote). When it flags, the words
  the document never uses are kept (``Support.unknown_words``) for the note beside the answer.

- ``entity_share`` (``support_entity``): how much of the question is said within a few lines of the answer's own
  words on its cited pages. An answer that copies a neighbouring entity's string (another OS's version, another
  project's author) passes ``grounded_share`` and ``document_share``; it sits among another entity's words.

A further one, ``verify_yes``, costs a short prefill: before the answer the model is asked, on the document's cached K/V,
whether the document states the answer to the question (``verify_prompt``), and P(yes) / (P(yes) + P(no)) is read off
its next-token distribution (``yes_share``; ``DocumentSession.check_support`` runs it and leaves the conversation as
it was). It runs only where a model's rule uses it (``min_verify_yes`` > 0) or when asked for.

The answer is flagged when any signal is under its threshold (``SupportThresholds``). The thresholds are fitted per
model by ``benchmarks/quality/support_eval.py`` on ``benchmarks/data/support_eval.json`` and reported held out (leave one
question out) in ``docs/benchmarks/support.md``; ``thresholds_for`` picks a model's.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import torch

from ..errors import InputError

_SINK = 4  # the prompt's first tokens: an "attention sink" in most models, on no page and on no question


@dataclass(frozen=True)
class SupportThresholds:
    """An answer is supported when every signal reaches its minimum (0 and -100 switch a signal off)."""

    min_document_share: float = 0.30
    min_mean_logprob: float = -0.60
    min_grounded_share: float = 0.0
    # The verification turn's P(yes) (``check_support``); 0 is off, and the session then runs no check at all.
    min_verify_yes: float = 0.0
    min_claim_logprob: float = -100.0  # the claim tokens' mean log-prob (``claim_logprob``); -100 is off
    min_asked_share: float = 0.0  # the question's words the document uses (``asked_share``); 0 is off
    # How much of the question is said around the answer's own words on its cited pages (``support_entity``); 0 is off.
    min_entity_share: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_document_share <= 1.0:
            raise InputError(f"min_document_share must be in [0, 1], got {self.min_document_share}")
        if self.min_mean_logprob > 0.0:
            raise InputError(f"min_mean_logprob must be <= 0, got {self.min_mean_logprob}")
        if not 0.0 <= self.min_grounded_share <= 1.0:
            raise InputError(f"min_grounded_share must be in [0, 1], got {self.min_grounded_share}")
        if not 0.0 <= self.min_verify_yes <= 1.0:
            raise InputError(f"min_verify_yes must be in [0, 1], got {self.min_verify_yes}")
        if self.min_claim_logprob > 0.0:
            raise InputError(f"min_claim_logprob must be <= 0, got {self.min_claim_logprob}")
        if not 0.0 <= self.min_asked_share <= 1.0:
            raise InputError(f"min_asked_share must be in [0, 1], got {self.min_asked_share}")
        if not 0.0 <= self.min_entity_share <= 1.0:
            raise InputError(f"min_entity_share must be in [0, 1], got {self.min_entity_share}")


@dataclass(frozen=True)
class Support:
    """The signals of one answer and the decision drawn from them."""

    document_share: float | None  # None without a sources pass (no retrieval heads, sources off)
    mean_logprob: float | None  # None for an empty answer
    is_supported: bool
    grounded_share: float | None = None  # None without sources or when the answer adds no word of its own
    verify_yes: float | None = None  # None when no verification turn ran (``min_verify_yes`` off, or not asked)
    claim_logprob: float | None = None  # None for an empty answer (or when the caller had no token texts)
    asked_share: float | None = None  # None when the question has no content word (or no document words given)
    unknown_words: tuple[str, ...] = ()  # the question's words the document never uses, when they flagged it
    entity_share: float | None = None  # None without sources or when the answer adds no word of its own


def document_share(mass: torch.Tensor, document_range: tuple[int, int],
                   pages: list[tuple[int, str]]) -> float | None:
    """The share of ``mass`` ([L], ``attention_mass``) on the document's pages (from the first page marker, or
    the document range without pages) among all positions after the attention sink; None when there is none."""
    start, stop = document_range
    first = pages[0][0] if pages else start
    first = max(first, start, _SINK)
    total = float(mass[_SINK:].sum())
    if total <= 0 or first >= stop:
        return None
    return float(mass[first:stop].sum()) / total


def mean_logprob(logprobs: list[float]) -> float | None:
    """The mean log-probability of an answer's tokens; None for an empty answer."""
    return sum(logprobs) / len(logprobs) if logprobs else None


def decide(share: float | None, logprob: float | None,
           thresholds: SupportThresholds = SupportThresholds(), grounded: float | None = None,
           verified: float | None = None, claim: float | None = None,
           asked: tuple[float | None, tuple[str, ...]] = (None, ()), entity: float | None = None) -> Support:
    """Flags an answer whose attention stayed off the pages, whose tokens (or whose claim's own tokens, ``claim``)
    were written unsure, or whose own words are not on the pages it looked at, or which the model itself, asked
    afterwards, does not find stated in the document (``verified``: its P(yes)), or whose question names what the
    document never does (``asked``: ``asked_share``'s share and the words), or whose own words sit on its pages
    among another entity's words than the question's (``entity``: ``support_entity.entity_share``). A missing signal
    does not flag: without sources the answer is judged on its probabilities alone."""
    asked_share_, unknown = asked
    low_share = share is not None and share < thresholds.min_document_share
    unsure = logprob is not None and logprob < thresholds.min_mean_logprob
    ungrounded = grounded is not None and grounded < thresholds.min_grounded_share
    denied = verified is not None and verified < thresholds.min_verify_yes
    unsure_claim = claim is not None and claim < thresholds.min_claim_logprob
    off_topic = asked_share_ is not None and asked_share_ < thresholds.min_asked_share
    elsewhere = entity is not None and entity < thresholds.min_entity_share
    flagged = low_share or unsure or ungrounded or denied or unsure_claim or off_topic or elsewhere
    # The words go to the note only when they are why: on a short document a common verb ("makes") is unknown too.
    return Support(share, logprob, not flagged, grounded, verified, claim, asked_share_, unknown if off_topic else (),
                   entity)


def token_logprob(logits: torch.Tensor, token: int) -> float:
    """log p(token) under ``logits`` ([vocab], the raw logits of the step that chose it)."""
    value = float(torch.log_softmax(logits.float(), dim=-1)[token])
    return value if math.isfinite(value) else -100.0


# -- the verification turn: the model asked whether the document states the answer ------------------------------

VERIFY_PROMPT = "Does the document state the answer to this question: {question} Answer yes or no."


def verify_prompt(question: str) -> str:
    """The verification turn's text for ``question`` (asked after the answer, on the document's cached K/V)."""
    return VERIFY_PROMPT.format(question=question.strip())


@functools.lru_cache(maxsize=16)  # once per tokenizer: the ids of "yes"/"no" never change
def _answer_ids(tokenizer, words: tuple[str, ...]) -> tuple[int, ...]:
    """The first token of each spelling of ``words`` (bare, capitalised, upper case, after a space)."""
    ids = set()
    for word in words:
        for spelling in (word, word.capitalize(), word.upper(), " " + word, " " + word.capitalize()):
            encoded = tokenizer(spelling, add_special_tokens=False)["input_ids"]
            if encoded:
                ids.add(encoded[0])
    return tuple(sorted(ids))


def yes_share(logits: torch.Tensor, tokenizer) -> float:
    """P(yes) / (P(yes) + P(no)) under ``logits`` ([vocab], the next token after the verification turn), summed
    over the spellings of each word; 0.5 when neither has any probability."""
    probs = torch.softmax(logits.float(), dim=-1)
    yes_ids, no_ids = _answer_ids(tokenizer, ("yes",)), _answer_ids(tokenizer, ("no",))
    if set(yes_ids) & set(no_ids):  # a tokenizer that splits both into one shared first piece cannot tell them apart
        return 0.5
    yes, no = float(probs[list(yes_ids)].sum()), float(probs[list(no_ids)].sum())
    return yes / (yes + no) if yes + no > 0 else 0.5


# -- candidate signals fitted offline (benchmarks/quality/support_eval.py) -------------------------------------------

# Words that carry no claim of their own: an answer's "the", "is", "document" are on every page.
_STOPWORDS = frozenset("""
a an the and or but if then else of to in on at by for from with without into onto about as is are was were be been
being it its this that these those there here which what who whom whose when where why how can could may might must
shall should will would do does did done has have had not no nor so such than too very also only just any all some
each every both either neither one you your yours we our they their them he she his her i me my use used using uses
set sets page pages document documents say says said answer question text provided mentioned specified given see
following follows value default option options command commands file files name named called like e.g i.e
""".split())
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./+-]*[A-Za-z0-9_]|[A-Za-z0-9]|[<>&|]+")


def _content_words(text: str) -> frozenset[str]:
    return frozenset({w.lower().strip("./-") or w for w in _WORD.findall(text)} - _STOPWORDS - {""})


@functools.lru_cache(maxsize=256)  # a document's pages are split into words once, not once per answer
def content_words(text: str) -> frozenset[str]:
    """The words of ``text`` that carry a claim: lowercased, stopwords and bare punctuation left out, operators
    such as ``<>`` and ``>&`` kept (they are answers here)."""
    return _content_words(text)


def stem(word: str) -> str:
    """A crude stem, enough to meet a question's inflection in the document ("opens", "appends", "allocates" and
    "open", "append", "allocate"): one ending of -ing, -ed, -es, -s, -e cut where a stem of 3 letters is left."""
    for suffix in ("ing", "ed", "es", "s", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and word[:-len(suffix)].isalpha():
            return word[:-len(suffix)]
    return word


@functools.lru_cache(maxsize=4)  # per document: a book's words are gathered once (0.6 s for 1M tokens), not per answer
def document_words(document: str) -> frozenset[str]:
    """The stems (``stem``) of every content word of ``document`` (not through ``content_words``' cache of 256
    texts: a whole book's text would stay alive in it)."""
    return frozenset(stem(word) for word in _content_words(document))


def asked_share(question: str, words: frozenset[str]) -> tuple[float | None, tuple[str, ...]]:
    """(the share of the question's content words whose stem ``words`` holds, the question's words it does not
    hold, sorted); (None, ()) for a question without a content word."""
    asked = content_words(question)
    if not asked:
        return None, ()
    unknown = tuple(sorted(word for word in asked if stem(word) not in words))
    return 1.0 - len(unknown) / len(asked), unknown


def page_texts(document: str, pages) -> dict[str, str]:
    """{page label: its text} from the document's ``pages`` (``DocumentTokens.pages``: where the caller says each one
    lies, never found in the text); one page "" for a document without them."""
    if not pages:
        return {"": document}
    texts: dict[str, str] = {}
    for i, page in enumerate(pages):
        stop = pages[i + 1].start if i + 1 < len(pages) else len(document)
        texts[page.label] = texts.get(page.label, "") + document[page.end:stop]
    return texts


def claim_tokens(tokens: list[str], answer: str, question: str) -> list[bool]:
    """Which of the answer's tokens (``tokens``: their texts, in order, joining into ``answer``) write its own claim:
    a content word of the answer that is not in the question. The rest restate the question ("The operator that
    opens ... is") or are markup and punctuation, written as surely over an invented answer as over a copied one."""
    asked = content_words(question)
    words = [(m.start(), m.end(), m.group().lower().strip("./-") or m.group()) for m in _WORD.finditer(answer)]
    mask, position = [], 0
    for token in tokens:
        start, stop = position, position + len(token)
        position = stop
        mask.append(any(s < stop and start < e and w not in asked and w not in _STOPWORDS for s, e, w in words))
    return mask


def claim_indices(tokens: list[str], logprobs: list[float], question: str) -> list[int]:
    """The positions of the answer's claim tokens (``claim_tokens``; ``tokens``: the answer's tokens as text,
    ``logprobs``: each one's log-prob, in order; positions past either list are never picked); all of them when it
    only restates the question (then the whole answer is its claim). The answer's text is the tokens joined, so a
    token that decodes to a partial character never shifts the others' positions."""
    n = min(len(tokens), len(logprobs))
    claim = claim_tokens(tokens[:n], "".join(tokens[:n]), question)
    return [i for i in range(n) if claim[i]] or list(range(n))


def claim_logprob(tokens: list[str], logprobs: list[float], question: str) -> float | None:
    """The mean log-prob of the answer's claim tokens (``claim_indices``). None for an empty answer."""
    picked = claim_indices(tokens, logprobs, question)
    return sum(logprobs[i] for i in picked) / len(picked) if picked else None


def grounded_share(answer: str, question: str, pages: list[str]) -> float | None:
    """The share of the answer's own content words (those not already in the question) found on ``pages`` (the
    text of the pages it attended to): an answer read off its pages repeats their words, an invented option or
    number is on none of them. None when the answer adds no word of its own."""
    own = content_words(answer) - content_words(question)
    if not own:
        return None
    seen = set().union(*(content_words(page) for page in pages)) if pages else set()
    return len(own & seen) / len(own)


# Fitted per model, each on its own signals (docs/benchmarks/support.md, "judged per answer"; held-out rates in its
# "Notes from the code"); matched on the lowercased name or path, first match wins, else the CPU default's (first).
_FITTED: tuple[tuple[str, SupportThresholds], ...] = (
    ("qwen2.5-coder-1.5b",
     SupportThresholds(min_document_share=0.536, min_mean_logprob=-0.341, min_grounded_share=0.0)),
    ("qwen2.5-coder-0.5b",
     SupportThresholds(min_document_share=0.494, min_mean_logprob=-100.0, min_grounded_share=0.0)),
    ("smollm2", SupportThresholds(min_document_share=0.0, min_mean_logprob=-100.0, min_grounded_share=0.0,
                                  min_claim_logprob=-0.944)),
)


def thresholds_for(name: str) -> SupportThresholds:
    """The fitted thresholds of the model loaded from ``name`` (a repository id or a file path)."""
    name = name.lower()
    for key, thresholds in _FITTED:
        if key in name:
            return thresholds
    return _FITTED[0][1]
