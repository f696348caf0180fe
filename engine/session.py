"""``DocumentSession``: read a document once (chunked prefill), then answer questions about it.

The session owns one ``HeadInferCache``. The document prefix is prefilled once; each question reuses the
longest prefix of tokens the cache already holds (the document, and earlier turns when they still match),
so a follow-up or a new conversation never reads the document again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .cache import HeadInferCache
from .planner import ModelShape, Plan, PlanError, estimate_prefill_seconds, make_plan
from .policy import OffloadPolicy
from .prompt import PromptBuilder, Turn
from .rates import plan_rates
from .sampling import IncrementalDecoder, next_token
from .snapshot import CorruptSnapshotError, RestoreStats, SnapshotError, SnapshotInfo, SnapshotStore
from .telemetry import detect_budgets

logger = logging.getLogger(__name__)

# FLOP rate measured per loaded model, so each browser session does not re-measure it.
_MEASURED_RATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class PrefillCancelled(Exception):
    """Raised by ``prefill`` when ``should_stop`` turned true; the cache ends at a chunk boundary."""


@dataclass(frozen=True)
class PrefillProgress:
    tokens_done: int
    tokens_total: int
    tokens_per_second: float
    elapsed: float

    @property
    def fraction(self) -> float:
        return self.tokens_done / self.tokens_total if self.tokens_total else 1.0

    @property
    def eta_seconds(self) -> float | None:
        if self.tokens_per_second <= 0:
            return None
        return (self.tokens_total - self.tokens_done) / self.tokens_per_second


@dataclass(frozen=True)
class AnswerChunk:
    text: str  # the whole answer so far
    new_text: str
    num_tokens: int
    ttft: float | None  # seconds from the question to the first answer token
    tokens_per_second: float  # decode rate after the first token
    done: bool
    stopped: bool = False


class DocumentSession:
    """Prefill a document once, then ask questions about it with streamed answers."""

    def __init__(self, model, tokenizer, policy: OffloadPolicy | None = None, *,
                 system_prompt: str | None = None, answer_budget: int = 1024):
        self.model = model
        self.tokenizer = tokenizer
        self.policy = policy or OffloadPolicy()
        self.answer_budget = answer_budget
        self.prompts = PromptBuilder(tokenizer, system_prompt)
        self.device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        text_config = model.config.get_text_config(decoder=True)
        self.shape = ModelShape.from_config(text_config, dtype_bytes=torch.tensor([], dtype=dtype).element_size(),
                                            num_params=sum(p.numel() for p in model.parameters()))
        self._reset_document()

    # -- state -----------------------------------------------------------------------------------
    def _reset_document(self) -> None:
        self.cache: HeadInferCache | None = None
        self.document = ""
        self._document_ids: list[int] = []
        self._cached_ids: list[int] = []  # exactly the tokens whose K/V the cache holds
        self.turns: list[Turn] = []

    @property
    def document_tokens(self) -> int:
        return len(self._document_ids)

    @property
    def prefilled_tokens(self) -> int:
        return min(len(self._cached_ids), self.document_tokens)

    @property
    def is_prefilled(self) -> bool:
        return self.document_tokens > 0 and self.prefilled_tokens == self.document_tokens

    @property
    def max_context(self) -> int:
        return self.document_tokens + self.answer_budget

    # -- planning --------------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def plan(self, text: str) -> Plan:
        """The memory plan for ``text`` as a document (plus the answer budget); never allocates."""
        return self._plan_tokens(len(self.prompts.document_ids(text)) + self.answer_budget)

    def _plan_tokens(self, context_tokens: int) -> Plan:
        gpu_budget, host_budget = detect_budgets(str(self.device))
        return make_plan(self.shape, self.policy, context_tokens, device_is_cuda=self.device.type == "cuda",
                         gpu_budget=self.policy.gpu_memory or gpu_budget,
                         host_budget=self.policy.host_memory or host_budget, rates=plan_rates(self.policy, self.device))

    def estimate_prefill_seconds(self, num_tokens: int) -> float:
        """Seconds to prefill ``num_tokens``, from this machine's measured rate (measured once per model)."""
        rate = _MEASURED_RATES.get(self.model)
        if rate is None:
            rate = _MEASURED_RATES[self.model] = self._calibrate()
        return estimate_prefill_seconds(self.shape, num_tokens, rate)

    def _calibrate(self, num_tokens: int = 128) -> float:
        """Measures the model's FLOP rate on a short forward, so estimates are in this machine's seconds."""
        ids = torch.randint(0, self.shape.vocab_size, (1, num_tokens), device=self.device)
        with torch.inference_mode():
            self.model(ids[:, :8], use_cache=False)  # warm-up
            start = time.perf_counter()
            self.model(ids, use_cache=False)
            seconds = time.perf_counter() - start
        return estimate_prefill_seconds(self.shape, num_tokens, 1.0) / max(seconds, 1e-6)

    # -- the document ----------------------------------------------------------------------------
    def prompt_tokens(self, text: str) -> int:
        """Tokens ``text`` takes as the document prefix (system prompt and chat markup included)."""
        return len(self.prompts.document_ids(text))

    def document_limit(self, text: str) -> int:
        """The most document-prefix tokens that fit the memory plan and ``policy.max_context``."""
        plan = self._plan_tokens(self.prompt_tokens(text) + self.answer_budget)
        limit = min(plan.max_context_tokens, self.policy.max_context or plan.max_context_tokens)
        return max(limit - self.answer_budget, 0)

    def set_document(self, text: str, *, truncate_to_fit: bool = False) -> int:
        """Tokenizes ``text`` as the document, replacing any previous one; returns its token count.

        Raises ``PlanError`` when it does not fit (memory plan or ``policy.max_context``) and
        ``truncate_to_fit`` is false; the previous document is kept in that case.
        """
        if not text.strip():
            raise ValueError("the document is empty: there is no text to read")
        ids = self.prompts.document_ids(text)
        limit = self.document_limit(text)
        if len(ids) > limit:
            reason = self._plan_tokens(len(ids) + self.answer_budget).reason or (
                f"the context limit is {self.policy.max_context:,} tokens")
            if not truncate_to_fit or limit < 1:
                raise PlanError(f"{reason} (the document takes {len(ids):,} tokens; at most {limit:,} fit)")
            text, ids = self._truncate(text, limit)
            logger.info("document truncated to %d tokens to fit", len(ids))
        # Built before the old document goes, so a refusal here loses nothing.
        policy = dataclasses.replace(self.policy, max_context=len(ids) + self.answer_budget)
        cache = HeadInferCache(self.model.config, policy, device=self.device)
        self.clear()
        self.document, self._document_ids, self.cache = text, ids, cache
        return len(ids)

    def _truncate(self, text: str, limit: int) -> tuple[str, list[int]]:
        """Keeps the beginning of ``text`` so that its prefix ids number at most ``limit``."""
        body = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        keep = max(limit - (self.prompt_tokens("") + 8), 1)
        while True:
            # Re-tokenizing decoded text can merge or split a few tokens: shrink until it fits.
            text = self.tokenizer.decode(body[:keep]) + "\n[... truncated to fit memory ...]"
            ids = self.prompts.document_ids(text)
            if len(ids) <= limit or keep == 1:
                return text, ids
            keep = max(keep - (len(ids) - limit) - 1, 1)

    def prefill(self, on_progress: Callable[[PrefillProgress], None] | None = None,
                should_stop: Callable[[], bool] | None = None) -> PrefillProgress:
        """Reads the document in chunks; resumes where a cancelled prefill stopped."""
        if self.cache is None:
            raise ValueError("no document: call set_document first")
        start_tokens, started = self.prefilled_tokens, time.perf_counter()
        progress = PrefillProgress(start_tokens, self.document_tokens, 0.0, 0.0)
        while self.prefilled_tokens < self.document_tokens:
            if should_stop is not None and should_stop():
                raise PrefillCancelled(f"stopped after {self.prefilled_tokens:,} of {self.document_tokens:,} tokens")
            done = self.prefilled_tokens
            self._forward(self._document_ids[done : done + self.policy.chunk_size])
            elapsed = time.perf_counter() - started
            progress = PrefillProgress(self.prefilled_tokens, self.document_tokens,
                                       (self.prefilled_tokens - start_tokens) / max(elapsed, 1e-9), elapsed)
            if on_progress is not None:
                on_progress(progress)
        return progress

    def _forward(self, ids: list[int]) -> torch.Tensor:
        """Appends ``ids`` to the cache; returns the last position's logits [vocab]. All-or-nothing."""
        boundary = len(self._cached_ids)
        try:
            with torch.inference_mode():
                input_ids = torch.tensor([ids], device=self.device)
                out = self.model(input_ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        except torch.OutOfMemoryError as error:
            self.cache.crop_to(boundary)  # layers that took the chunk give it back
            raise MemoryError(f"out of memory while reading {len(ids)} tokens; try a smaller chunk size "
                              f"or a smaller head group ({error})") from error
        except BaseException:
            self.cache.crop_to(min(boundary, self.cache.get_seq_length()))
            raise
        self._cached_ids.extend(ids)
        return out.logits[0, -1]

    # -- questions -------------------------------------------------------------------------------
    def ask(self, question: str, *, max_new_tokens: int = 512, temperature: float = 0.0, top_p: float = 1.0,
            should_stop: Callable[[], bool] | None = None) -> Iterator[AnswerChunk]:
        """Streams the answer to ``question``; the conversation so far is part of the prompt."""
        if not self.is_prefilled:
            raise ValueError("read the document first (prefill)")
        if not question.strip():
            raise ValueError("the question is empty")
        asked = time.perf_counter()
        wanted = self._document_ids + self.prompts.conversation_ids(self.document, self.turns, question)
        logits = self._extend_to(wanted)
        decoder = IncrementalDecoder(self.tokenizer)
        stop_ids = _stop_token_ids(self.model, self.tokenizer)
        generator = torch.Generator(device="cpu").manual_seed(0)
        first_at, num_tokens, stopped = None, 0, False
        for _ in range(max_new_tokens):
            token = next_token(logits, temperature, top_p, generator)
            if token in stop_ids:
                break
            num_tokens += 1
            first_at = first_at or time.perf_counter()
            new_text = decoder.push(token)
            yield AnswerChunk(decoder.text, new_text, num_tokens, first_at - asked,
                              _rate(num_tokens, first_at), done=False)
            if should_stop is not None and should_stop():
                stopped = True
                break
            logits = self._forward([token])
        self.turns.append(Turn(question, decoder.text))
        yield AnswerChunk(decoder.text, "", num_tokens, None if first_at is None else first_at - asked,
                          _rate(num_tokens, first_at), done=True, stopped=stopped)

    def _extend_to(self, wanted: list[int]) -> torch.Tensor:
        """Crops the cache to its longest common prefix with ``wanted`` and feeds the rest."""
        common = 0
        for have, want in zip(self._cached_ids, wanted):
            if have != want:
                break
            common += 1
        common = min(common, len(wanted) - 1)  # at least one token to produce logits from
        self.cache.crop_to(common)
        del self._cached_ids[common:]
        logits = None
        for start in range(common, len(wanted), self.policy.chunk_size):
            logits = self._forward(wanted[start : start + self.policy.chunk_size])
        return logits

    def new_conversation(self) -> None:
        """Forgets the questions and answers; the document's KV stays."""
        self.turns = []
        if self.cache is not None and len(self._cached_ids) > self.prefilled_tokens:
            self.cache.crop_to(self.prefilled_tokens)
            del self._cached_ids[self.prefilled_tokens:]

    def clear(self) -> None:
        """Drops the document and frees its KV memory."""
        if self.cache is not None:
            self.cache.release()
        self._reset_document()

    def memory(self) -> dict:
        kv = self.cache.kv_bytes() if self.cache is not None else {"device": 0, "host": 0}
        return {"kv_device": kv["device"], "kv_host": kv["host"], "context_tokens": len(self._cached_ids),
                "max_context": self.max_context if self.document_tokens else 0}

    # -- snapshots: save / restore the document's KV cache (engine.snapshot) -----------------------
    def save_snapshot(self, store: SnapshotStore, label: str | None = None) -> SnapshotInfo | None:
        """Saves the prefilled document's K/V to ``store``; None when it exceeds the store's size cap.

        ``label`` names it in ``store.list()`` (default: the start of the document).
        """
        return store.save(self, label)

    def restore_snapshot(self, store: SnapshotStore) -> RestoreStats | None:
        """Restores the document's K/V from ``store`` instead of prefilling; afterwards it is prefilled.

        Returns None when there is nothing usable (none saved, or one that cannot load: logged, and a
        damaged one deleted), so the caller prefills as usual.
        """
        info = store.find(self)
        if info is None:
            return None
        try:
            return store.restore(self, info.key)
        except CorruptSnapshotError as error:
            logger.warning("%s; deleting it and reading the document instead", error)
            store.delete(info.key)
        except (SnapshotError, OSError) as error:
            logger.warning("%s; reading the document instead", error)
        return None


def _rate(num_tokens: int, first_at: float | None) -> float:
    if first_at is None or num_tokens < 2:
        return 0.0
    return (num_tokens - 1) / max(time.perf_counter() - first_at, 1e-9)


def _stop_token_ids(model, tokenizer) -> set[int]:
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return ids
