"""``DocumentSession``: read a document once (chunked prefill), then answer questions about it.

The session owns one ``HeadInferCache``. The document prefix is prefilled once; each question reuses the
longest prefix of tokens the cache already holds (the document, and earlier turns when they still match),
so a follow-up or a new conversation never reads the document again.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator

import torch

from .answer.generate import ConversationFit, document_page_starts, retrieval_heads, stream_answer
from .answer.sampling import RepetitionGuard
from .answer.sources import AnswerSources
from .answer.support import (asked_share, claim_logprob, decide, document_words, grounded_share, mean_logprob,
                             page_texts, thresholds_for, verify_prompt, yes_share)
from .cache import HeadInferCache, cache_argument
from .errors import ForwardInterrupted, InputError, PlanError, PrefillCancelled, QuestionTooLong, StateError
from .interrupt import interruptible, layer_callbacks, or_stopping
from .cpu.fused_decode import FusedDecode
from .models.weights_mode import weights_label, weights_mode
from .planning.budgets import MachineBudget, SharedBudget, held_bytes, measure_budget, num_weights
from .planning.capacity import capacity_options
from .planning.planner import make_plan
from .planning.plan import Plan
from .planning.shape import ModelShape
from .planning.out_of_memory import out_of_memory_message
from .planning.policy import OffloadPolicy
from .planning.window import conversation_allowance
from .read_time.costs import Chunk, ReadCosts, ReadTiming
from .read_time.estimator import ReadEstimator
from .read_time.pace import CheckpointPace, PrefillClock, prefill_step
from .prompt import DocumentTokens, PromptBuilder, Turn
from .reports import AnswerChunk, PrefillProgress, answer_rate
from .store.checkpoint import CheckpointPlan, ReadCheckpoints
from .store.files import snapshot_refusal
from .store.format import SnapshotIdentity
from .store.restore import restore_document
from .store.snapshots import RestoreStats, SnapshotInfo, SnapshotStore

logger = logging.getLogger(__name__)

# The conversation allowance a document's plan reserves beside it (``answer_budget``): a quarter of the model's
# window, at most 4,096 tokens (``planning.window.conversation_allowance``), for the answer and earlier turns. Past it
# the oldest turns leave the KV (the document never), so the homes are never grown mid-conversation.


class DocumentSession:
    """Prefill a document once, then ask questions about it with streamed answers."""

    def __init__(self, model, tokenizer, policy: OffloadPolicy | None = None, *,
                 system_prompt: str | None = None, answer_budget: int | None = None,
                 read_costs: ReadCosts | None = None):
        """``answer_budget``: the conversation allowance (default: ``conversation_allowance`` of the model's window);
        ``read_costs``: where completed reads' chunk timings are kept and estimates learn from (default: the
        shared record in the studio's cache folder)."""
        self.model = model
        self.tokenizer = tokenizer
        self.policy = policy or OffloadPolicy()
        self.answer_budget = answer_budget
        self.prompts = PromptBuilder(tokenizer, system_prompt)
        self.device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        text_config = model.config.get_text_config(decoder=True)
        # Weights as loaded: int8 codes and GGUF blocks are buffers, counted in their own bytes.
        self.shape = dataclasses.replace(
            ModelShape.from_config(text_config, dtype_bytes=torch.tensor([], dtype=dtype).element_size(),
                                   num_params=num_weights(model)),
            weight_bytes=held_bytes(model))
        # How long reads take here (``engine.read_time``): the app's plan panel and queue ask ``session.read_time``.
        self.read_time = ReadEstimator(model, self.shape, self.policy, read_costs, weights=weights_mode(model))
        # What the weights are (mode, words), for the plan panel: lossy ones said so where the plan is shown.
        self.weights = (weights_mode(model), weights_label(model))
        if self.answer_budget is None:
            self.answer_budget = conversation_allowance(self.shape.max_positions or None)
        elif self.shape.max_positions:
            # At most half the trained window: a small-window model must still read a document beside it.
            self.answer_budget = min(self.answer_budget, self.shape.max_positions // 2)
        # Ask the verification turn after every answer even where the model's fitted rule does not use it (to
        # measure it); the rule's ``min_verify_yes`` > 0 asks it anyway. ``verify_seconds``: the last one's cost.
        self.verify_support = False
        self.verify_seconds = 0.0
        # A CPU decode step of a Llama-family model on GGUF blocks: two C calls a layer (None: the model's forward).
        self._fused = FusedDecode.for_model(model) if self.device.type == "cpu" else None
        self._reset_document()

    # -- state -----------------------------------------------------------------------------------
    def _reset_document(self) -> None:
        self.cache: HeadInferCache | None = None
        self.document = ""
        self._document_ids: list[int] = []
        self._cached_ids: list[int] = []  # exactly the tokens whose K/V the cache holds
        self._identity: SnapshotIdentity | None = None  # computed once per document, when first needed
        self._pages: list[tuple[int, int]] | None = None  # (first token, page) of the given pages, when needed
        self._starts = None  # where each document token starts in the text (DocumentTokens.starts)
        self._page_bounds: tuple = ()  # where each page lies in the text, as the caller gave it (DocumentTokens.pages)
        self.turns: list[Turn] = []
        self.dropped_turns = 0  # oldest turns the last question left out of its prompt (to fit the allowance)
        # When an answer reads "the document may not say this": fitted per model (engine.answer.support).
        # (A session retired by a model switch has no model: clearing it again, from any path, must still work.)
        config = getattr(self.model, "config", None)
        self.support_thresholds = thresholds_for(getattr(config, "_name_or_path", "") or "")
        self._page_texts: dict[str, str] | None = None  # {page label: text}, for the support check, when needed
        self._context_limit, self._limit_reason = 0, ""  # the document's plan: the most its context may take, and why
        self._host_ms_per_token = 0.0  # the last answer's host-attention time per token (meters)

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
        """The conversation allowance: the document plus the ``answer_budget`` its cache is planned for."""
        return self.document_tokens + self.answer_budget

    @property
    def context_limit(self) -> int:
        """The most tokens the document's whole context (document, conversation, answer) may take: the smallest of
        what memory holds, ``policy.max_context`` and the model's trained window (0 without a document)."""
        return self._context_limit

    def question_room(self, max_new_tokens: int) -> int:
        """Tokens a question may take now (its chat markup included) beside the document and a ``max_new_tokens``
        answer, with no earlier turn kept: the bar the app shows and checks before any work."""
        return max(self._context_limit - self.document_tokens - max_new_tokens, 0)

    def fit_question(self, question: str, max_new_tokens: int) -> ConversationFit:
        """The ids ``question`` will be asked with, checked before any work.

        Raises ``QuestionTooLong`` (with the numbers) when even alone, with every earlier turn left out, it does not
        fit the context limit. Otherwise, while the conversation would pass its allowance (``max_context``), the
        oldest turns are left out first; a question that passes the allowance alone but fits the limit is kept.

        One tokenization when the conversation fits whole (the usual case): the question alone is rendered only when
        turns must go, or when the conversation fits its allowance but not the limit. Alone it is never longer
        than with earlier turns before it, so a conversation within both fits alone too.
        """
        for dropped in range(len(self.turns)):
            ids = self.prompts.conversation_ids(self.document, self.turns[dropped:], question)
            need = self.document_tokens + len(ids) + max_new_tokens
            if need <= self.max_context:
                if need > self._context_limit:
                    self._question_alone(question, max_new_tokens)  # raises when it does not fit even alone
                return ConversationFit(dropped, ids)
        return ConversationFit(len(self.turns), self._question_alone(question, max_new_tokens))

    def _question_alone(self, question: str, max_new_tokens: int) -> list[int]:
        """``question``'s ids with no earlier turn; ``QuestionTooLong`` when even so it passes the context limit."""
        alone = self.prompts.conversation_ids(self.document, [], question)
        need = self.document_tokens + len(alone) + max_new_tokens
        if need > self._context_limit:
            room = self.question_room(max_new_tokens)
            raise QuestionTooLong(
                f"the question takes {len(alone):,} tokens; with the document ({self.document_tokens:,}) and room for "
                f"a {max_new_tokens:,}-token answer that is {need:,} tokens, past the {self._context_limit:,} this "
                f"context may take ({self._limit_reason}). A question may take at most {room:,} tokens here",
                question_tokens=len(alone), room=room)
        return alone

    # -- planning --------------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def tokenize(self, text: str, pages=()) -> DocumentTokens:
        """Tokenizes ``text`` as the document prefix, once: pass the result to ``plan`` and ``set_document``.

        ``pages``: where each page lies in ``text`` (``engine.types.PageMarker``s, character offsets the caller wrote
        when it joined its documents); the answers' sources name these pages and no others. Nothing is parsed from
        the text: a caller whose text is its own may pass ``engine.types.page_markers(text)``."""
        return self.prompts.tokenize_document(text, pages)

    def plan(self, document: DocumentTokens | str) -> Plan:
        """The memory plan for ``document`` (plus the answer budget); never allocates."""
        return self._plan_tokens(len(self._tokens(document)) + self.answer_budget)

    def document_limit(self, plan: Plan) -> int:
        """Tokens a document (with its prompt) may take under ``plan``: its context limit less the room kept for
        the conversation (``answer_budget``); what "truncate to fit" reads of a longer one."""
        return max(plan.context_limit - self.answer_budget, 0)

    def document_plan(self) -> Plan:
        """The memory plan of the document taken by ``set_document`` (truncated, if it was), from its token count:
        nothing is tokenized again."""
        return self._plan_tokens(self.max_context)

    def _tokens(self, document: DocumentTokens | str) -> DocumentTokens:
        return document if isinstance(document, DocumentTokens) else self.tokenize(document)

    @functools.cached_property
    def _shared(self) -> SharedBudget:
        """This machine, read once per loaded model, after it was loaded (free GPU memory less the reserve, available
        RAM, decode rates; on CUDA one dry-run chunk's activation peak), and shared with the other tabs serving it."""
        return SharedBudget.of(self.model, self.policy, lambda: measure_budget(self.device, self.policy, model=self.model,
                                                                   vocab_size=self.shape.vocab_size))

    @property
    def machine(self) -> MachineBudget:
        """The machine as this session's plans see it: the reading less what other tabs' documents hold."""
        return self._shared.budget_for(self)

    def _plan_tokens(self, context_tokens: int) -> Plan:
        return make_plan(self.shape, self.policy, context_tokens, machine=self.machine)

    def capacity_options(self) -> list:
        """How far each capacity option reaches here (RAM, + 8-bit, + the disk tier when it has a folder)."""
        machine = self.machine  # its budgets are the policy's where it sets them, less what other tabs hold
        policy = dataclasses.replace(self.policy, gpu_memory=None, host_memory=None)
        return capacity_options(self.shape, policy, device_is_cuda=machine.device_is_cuda,
                                gpu_budget=machine.gpu_budget, host_budget=machine.host_budget)

    # -- the document ----------------------------------------------------------------------------
    def limits(self) -> Plan:
        """The plan of a minimal document: its ``context_limit`` (answers included) and ``limit_reason`` say
        how much any document may take, before one is tokenized."""
        return self._plan_tokens(1 + self.answer_budget)

    def set_document(self, document: DocumentTokens | str, *, truncate_to_fit: bool = False, pages=()) -> int:
        """Takes ``document`` (text, or ``tokenize``'s result) as the document, replacing any previous one;
        returns its token count. ``pages``: with a text, where its pages lie (as ``tokenize`` takes them); a
        ``tokenize`` result carries its own.

        Raises ``PlanError`` when it does not fit (memory, ``policy.max_context`` or the model's trained
        window) and ``truncate_to_fit`` is false; the previous document is kept in that case.
        """
        if not (document.text if isinstance(document, DocumentTokens) else document).strip():
            raise InputError("the document is empty: there is no text to read")
        if pages and isinstance(document, DocumentTokens):
            raise InputError("pages go to tokenize with the text; tokenize's result carries them")
        tokens = self._tokens(document) if not pages else self.tokenize(document, pages)
        plan = self._plan_tokens(len(tokens) + self.answer_budget)
        limit = self.document_limit(plan)
        if len(tokens) > limit:
            if not truncate_to_fit or limit < 1:
                gpu, host = self._shared.held_by_others(self)
                others = (f"; other tabs' documents hold {(gpu + host) / 2**30:.2f} GiB of this machine's memory"
                          if plan.limited_by == "memory" and gpu + host else "")
                raise PlanError(f"{plan.limit_reason} (the document takes {len(tokens):,} tokens; at most {limit:,} "
                                f"fit{others})")
            tokens = self.prompts.truncate_document(tokens, limit)
            logger.info("document truncated to %d tokens to fit", len(tokens))
            plan = self._plan_tokens(len(tokens) + self.answer_budget)  # the plan of what is kept
        # Built before the old document goes, so a refusal here loses nothing. The cache allocates this plan.
        policy = dataclasses.replace(self.policy, max_context=plan.context_tokens)
        cache = HeadInferCache(self.model.config, policy, plan=plan, device=self.device)
        self.clear()
        self._shared.claim(self, plan, self.shape.weights_bytes)
        self.document, self._document_ids, self.cache = tokens.text, tokens.ids, cache
        self._starts, self._page_bounds = tokens.starts, tokens.pages
        self._context_limit, self._limit_reason = plan.context_limit, plan.limit_reason
        return len(tokens)

    def prefill(self, on_progress: Callable[[PrefillProgress], None] | None = None,
                should_stop: Callable[[], bool] | None = None,
                give_way: Callable[[], None] | None = None,
                checkpoints: CheckpointPlan | None = None) -> PrefillProgress:
        """Reads the document in chunks; resumes where a cancelled prefill stopped (or a partial snapshot restored).

        ``checkpoints``: the read is checkpointed into that store as it goes (``store/checkpoint.py``), so that after
        a crash ``restore_snapshot`` brings back what was read and ``prefill`` continues from there.

        ``give_way()`` runs between forwards and, on a CPU (where one forward of a long chunk takes minutes), between
        decoder layers too: a caller sharing the device with other visitors may block there while they compute (the
        model's weights are only read; each session has its own cache). That time is not counted as reading, and
        ``should_stop`` is asked again right after. Each forward's timing is kept (``ReadCosts``) for later estimates.
        """
        if self.cache is None:
            raise StateError("no document: call set_document first")
        clock = PrefillClock(self.shape, self.prefilled_tokens, self.document_tokens, on_progress)
        progress = PrefillProgress(self.prefilled_tokens, self.document_tokens, 0.0, 0.0)
        timing = ReadTiming(self.read_time.load_probe)
        paused = [0.0]

        def pause() -> None:
            started = time.perf_counter()
            give_way()
            seconds = time.perf_counter() - started
            paused[0] += seconds
            clock.paused(seconds)

        def within_forward(layer: int, num_layers: int) -> None:
            clock.within_forward(layer, num_layers)
            if layer > 0:
                pause()

        inside = within_forward if give_way is not None and self.device.type == "cpu" else clock.within_forward
        writer, pace = self._checkpoints(checkpoints)
        try:
            # Checked between layers too, so a cancel lands within about a layer's time; the chunk that was
            # under way is cropped off by ``_forward``, leaving the cache at a chunk boundary.
            with self.read_time.load_probe.computing(), interruptible(self.model, should_stop), \
                    layer_callbacks(self.model, inside):
                while self.prefilled_tokens < self.document_tokens:
                    if should_stop is not None and should_stop():
                        raise self._cancelled()
                    done = self.prefilled_tokens
                    size = min(prefill_step(self.policy.chunk_size, self.device.type, done), self.document_tokens - done)
                    clock.begin_forward(done, size)
                    started, paused_before = time.perf_counter(), paused[0]
                    try:
                        self._forward(self._document_ids[done : done + size])
                    except ForwardInterrupted as interrupted:
                        raise self._cancelled() from interrupted
                    timing.add(Chunk(done, size, time.perf_counter() - started - (paused[0] - paused_before)))
                    progress = clock.end_forward(self.prefilled_tokens)
                    if writer is not None and self.prefilled_tokens < self.document_tokens and pace.after_forward() \
                            and writer.checkpoint(self.prefilled_tokens, progress.elapsed):
                        pace.started()
                    if self.prefilled_tokens < self.document_tokens:
                        timing.between_chunks()
                        if give_way is not None:
                            pause()
        finally:
            if writer is not None:  # the homes stay as they are until the checkpoint being written has landed
                writer.close(self.prefilled_tokens, progress.elapsed)  # (after a Ctrl+C, one of what was read first)
            timing.record(self.read_time.read_costs, self.read_time.costs_key)
        self.cache.anchor(self.document_tokens)  # sliding-window rings can always come back to the document's end
        return progress

    def _checkpoints(self, plan: CheckpointPlan | None) -> tuple[ReadCheckpoints | None, CheckpointPace | None]:
        if plan is None or self.is_prefilled or snapshot_refusal(self.cache.shape):  # (hybrid models' states)
            return None, None
        plan = plan if plan.label else dataclasses.replace(plan, label=self.document)
        writer = ReadCheckpoints(plan, self.cache, self._document_ids, self.snapshot_identity(), self.prefilled_tokens,
                                 dataclasses.asdict(self.policy))
        return writer, CheckpointPace(plan.every_seconds, plan.every_chunks)

    def _cancelled(self) -> PrefillCancelled:
        return PrefillCancelled(f"stopped after {self.prefilled_tokens:,} of {self.document_tokens:,} tokens")

    def _forward(self, ids: list[int], should_stop: Callable[[], bool] | None = None) -> torch.Tensor:
        """Appends ``ids`` to the cache; returns the last position's logits [vocab]. All-or-nothing. ``should_stop``:
        checked between layers by the fused decode step (the model's own forward is stopped by the hooks of
        ``interruptible``)."""
        boundary = len(self._cached_ids)
        try:
            with torch.inference_mode():
                if len(ids) == 1 and self._fused is not None:
                    logits = self._fused.step(ids[0], self.cache, should_stop)
                else:
                    input_ids = torch.tensor([ids], device=self.device)
                    logits = self.model(input_ids, **{cache_argument(self.model): self.cache}, use_cache=True,
                                        logits_to_keep=1).logits[0, -1]
        except torch.OutOfMemoryError as error:
            self._give_back(boundary)  # layers that took the chunk give it back: the document and conversation stay
            raise MemoryError(out_of_memory_message(len(ids), self.device.type, error)) from error
        except BaseException:
            self._give_back(boundary)
            raise
        self._cached_ids.extend(ids)
        return logits

    def _give_back(self, boundary: int) -> None:
        """After a failed forward: back to ``boundary`` tokens, or, for a hybrid model whose fixed-size states may
        have advanced part-way, back to where they were kept (the document's end)."""
        kept = self.cache.restorable_length(min(boundary, self.cache.get_seq_length()), states_advanced=True)
        self.cache.crop_to(kept)
        del self._cached_ids[kept:]

    # -- questions -------------------------------------------------------------------------------
    def ask(self, question: str, *, max_new_tokens: int = 512, temperature: float = 0.0, top_p: float = 1.0,
            should_stop: Callable[[], bool] | None = None, repetition_guard: RepetitionGuard | None = RepetitionGuard(),
            sources: bool = True, on_question_progress: Callable[[int, int], None] | None = None,
            fit: ConversationFit | None = None) -> Iterator[AnswerChunk]:
        """Streams the answer to ``question``; the conversation so far is part of the prompt.

        The question is checked first (``fit_question``: refused with ``QuestionTooLong``, or the oldest turns left
        out). Its own tokens are read in chunks, ``should_stop`` checked between layers as in ``prefill``
        (``on_question_progress(done, total)`` after each chunk); a stop there ends the answer at once, empty and
        ``stopped``. ``repetition_guard`` (a sampling choice) penalises and stops loops; ``None`` gives the exact
        greedy continuation. ``sources``: the final chunk carries the pages the answer attended to. ``fit``: what
        ``fit_question(question, max_new_tokens)`` gave for this conversation, when the caller checked the question
        already (the app does, to refuse it before queueing): the question is then not tokenized again.
        """
        if not self.is_prefilled:
            raise StateError("read the document first (prefill)")
        if not question.strip():
            raise InputError("the question is empty")
        asked = time.perf_counter()
        if fit is None:
            fit = self.fit_question(question, max_new_tokens)
        self.dropped_turns = fit.num_dropped
        if fit.num_dropped:
            logger.info("left the %d oldest turns out of the prompt to stay within the conversation allowance",
                        fit.num_dropped)
        kept = self.turns[fit.num_dropped:]
        wanted = self._document_ids + fit.ids
        verified = None
        if self.verify_support or self.support_thresholds.min_verify_yes > 0:
            # Before the answer and its sources pass (which would record the check's attention): the measured
            # variant asks about the question alone, whatever the answer says (docs/benchmarks/support.md).
            checked = time.perf_counter()
            verified = self.check_support(question, kept)
            self.verify_seconds = time.perf_counter() - checked
        answered = yield from self._answer(wanted, question, asked, verified, max_new_tokens=max_new_tokens,
                                           temperature=temperature, top_p=top_p, should_stop=should_stop,
                                           repetition_guard=repetition_guard, sources=sources,
                                           on_question_progress=on_question_progress)
        if answered is not None:
            end, final = answered
            self.turns = [*kept, Turn(question, end.text)]
            yield final

    def complete(self, continuation: list[int], *, question: str = "", max_new_tokens: int = 512,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                 should_stop: Callable[[], bool] | None = None, sources: bool = True) -> Iterator[AnswerChunk]:
        """Streams the continuation of the prompt ``document + continuation`` (``continuation``: ids after the
        document's prefix, e.g. another client's conversation rendered with the chat template), reusing the longest
        prefix of K/V the cache holds, as ``ask`` does; no turn is recorded and the prompt is the caller's to fit
        (``reused_tokens``, ``max_context``). ``question``: the text the support check weighs (the last user
        message). Exact greedy at ``temperature`` 0 (no repetition guard); ``seed`` seeds the sampling."""
        if not self.is_prefilled:
            raise StateError("read the document first (prefill)")
        answered = yield from self._answer(self._document_ids + list(continuation), question, time.perf_counter(),
                                           None, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                           should_stop=should_stop, repetition_guard=None, sources=sources, seed=seed)
        if answered is not None:
            yield answered[1]

    def reused_tokens(self, continuation: list[int]) -> int:
        """How many tokens of the prompt ``document + continuation`` the cache holds already (what ``complete`` will
        not compute again; at least the last token is always computed, for its logits)."""
        wanted = self._document_ids + list(continuation)
        common = 0
        for have, want in zip(self._cached_ids, wanted):
            if have != want:
                break
            common += 1
        common = min(common, len(wanted) - 1)
        return self.cache.restorable_length(common) if self.cache is not None and common > 0 else max(common, 0)

    def _answer(self, wanted: list[int], question: str, asked: float, verified: float | None, *, max_new_tokens: int,
                temperature: float, top_p: float, should_stop, repetition_guard, sources: bool,
                on_question_progress=None, seed: int = 0):
        """Extends the cache to ``wanted`` and streams the answer's chunks; returns ``(Decoded, final chunk)``, the final
        chunk not yet yielded (``ask`` records its turn first), or None after yielding a stopped, empty end."""
        should_stop = or_stopping(should_stop)  # a Ctrl+C stops the answer too (the fused decode step asks this one)
        grounding = self._grounding() if sources else None
        if grounding is not None:
            grounding.start(len(wanted) - 1)  # from the query that writes the first answer token
        host_before = self.cache.host_attention_seconds
        try:
            self.read_time.load_probe.begin_computing()  # a load probe meanwhile would time our own work: it reuses the last one
            try:
                logits = self._extend_to(wanted, should_stop, on_question_progress)
            except ForwardInterrupted:
                yield AnswerChunk("", "", 0, None, 0.0, done=True, stopped=True)
                return None
            end = yield from stream_answer(self.model, self.tokenizer, logits,
                                           lambda ids: self._forward_unless_stopped(ids, should_stop), asked,
                                           max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                           should_stop=should_stop, repetition_guard=repetition_guard, seed=seed)
            # A stopped answer ends now: its sources would cost one more pass over the whole context.
            found = grounding.finish() if grounding is not None and not end.stopped else []
        finally:
            self.read_time.load_probe.end_computing()
            if grounding is not None:
                grounding.cancel()  # an abandoned answer stops recording (a no-op after finish)
        self._host_ms_per_token = 1000 * (self.cache.host_attention_seconds - host_before) / max(end.num_tokens, 1)
        return end, AnswerChunk(end.text, "", end.num_tokens, None if end.first_at is None else end.first_at - asked,
                                answer_rate(end.num_tokens, end.first_at), done=True, stopped=end.stopped,
                                looped=end.looped, sources=tuple(found),
                                sources_seconds=grounding.seconds if grounding else 0.0,
                                support=decide(grounding.document_share if grounding else None,
                                               mean_logprob(end.logprobs), self.support_thresholds,
                                               self._grounded(question, end.text, found), verified,
                                               self._claim_logprob(question, end),
                                               asked_share(question, document_words(self.document))))

    def check_support(self, question: str, turns: list[Turn] | None = None, prompt: str | None = None) -> float:
        """P(yes) / (P(yes) + P(no)) of the model's own next token after a verification turn (``verify_prompt``:
        does the document state the answer to ``question``?) asked after ``turns`` (default: the conversation so
        far; ``ask`` runs it before the answer, so in a fresh chat on the question alone). ``prompt``: another
        yes/no turn in its place (``support_claim.claim_prompt``: is this answer stated for what was asked?).

        Cheap next to an answer: the document's K/V is reused, so the check is a prefill of its few dozen tokens
        and one next-token distribution. It leaves the conversation as it was: the turn is not recorded and the
        cache goes back to where the next question would have cropped it anyway (the longest common prefix of
        the cache and this turn, which ends before any new user message), so the next answer is the same.
        """
        if not self.is_prefilled:
            raise StateError("read the document first (prefill)")
        turns = self.turns if turns is None else turns
        turn = verify_prompt(question) if prompt is None else prompt
        wanted = self._document_ids + self.prompts.conversation_ids(self.document, turns, turn)
        common = 0
        for have, want in zip(self._cached_ids, wanted):
            if have != want:
                break
            common += 1
        try:
            logits = self._extend_to(wanted)  # [vocab]
        finally:
            # Back to the shared prefix: the check's own tokens never reach the next question.
            kept = self.cache.restorable_length(min(common, self.cache.get_seq_length()), states_advanced=True)
            self.cache.crop_to(kept)
            del self._cached_ids[kept:]
        return yes_share(logits, self.tokenizer)

    def _claim_logprob(self, question: str, end) -> float | None:
        """``claim_logprob`` of the answer ``end`` (``Decoded``): its tokens decoded one by one (as the eval's records
        hold them), their log-probs from the decode itself. No forward: a decode per token and a regex."""
        tokens = [self.tokenizer.decode([token]) for token in end.token_ids]
        return claim_logprob(tokens, list(end.logprobs), question)

    def _grounded(self, question: str, answer: str, found: list) -> float | None:
        """``grounded_share`` of the answer on the pages it attended to (its sources); None without sources."""
        if not found:
            return None
        if self._page_texts is None:
            self._page_texts = page_texts(self.document, self._page_bounds)
        return grounded_share(answer, question, [self._page_texts.get(source.page or "", "") for source in found])

    def _grounding(self) -> AnswerSources | None:
        """Sources of the next answer from the model's retrieval heads (calibrated once per model, cached)."""
        heads = retrieval_heads(self.model, self.tokenizer)
        if heads is None:
            return None
        if self._pages is None:
            self._pages = document_page_starts(self._page_bounds, self._starts)
        return AnswerSources(self.cache, heads, (0, self.document_tokens), self._pages)

    def _forward_unless_stopped(self, ids: list[int], should_stop: Callable[[], bool] | None) -> torch.Tensor:
        """``_forward``, raising ``ForwardInterrupted`` between layers once ``should_stop()``; the hooks live for
        this forward only, so a paused answer never checks another tab's forwards run on the same thread."""
        with interruptible(self.model, should_stop):
            return self._forward(ids, should_stop)

    def _extend_to(self, wanted: list[int], should_stop: Callable[[], bool] | None = None,
                   on_progress: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """Crops the cache to its longest common prefix with ``wanted`` and feeds the rest in prefill-sized chunks,
        stoppable between layers (``ForwardInterrupted``; the cache then ends at a chunk boundary)."""
        common = 0
        for have, want in zip(self._cached_ids, wanted):
            if have != want:
                break
            common += 1
        common = min(common, len(wanted) - 1)  # at least one token to produce logits from
        common = self.cache.restorable_length(common)  # a hybrid model's states go back to their anchor only
        self.cache.crop_to(common)
        del self._cached_ids[common:]
        logits, start = None, common
        with interruptible(self.model, should_stop):
            while start < len(wanted):
                if should_stop is not None and should_stop():
                    raise ForwardInterrupted("stopped between chunks of the question")
                size = prefill_step(self.policy.chunk_size, self.device.type, start)
                logits = self._forward(wanted[start : start + size])
                start += size
                if on_progress is not None:
                    on_progress(min(start, len(wanted)) - common, len(wanted) - common)
        return logits

    def resume_conversation(self, turns: list[tuple[str, str]]) -> None:
        """Takes ``turns`` (question, answer) as the conversation so far, e.g. a reloaded page's; their tokens are
        read with the next question."""
        self.turns = [Turn(question, answer) for question, answer in turns]

    def conversation(self) -> list[tuple[str, str]]:
        """The conversation so far as (question, answer) pairs."""
        return [(turn.question, turn.answer) for turn in self.turns]

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
            self._shared.release(self)
        self._reset_document()

    def memory(self) -> dict:
        kv = self.cache.kv_bytes() if self.cache is not None else {"device": 0, "host": 0, "disk": 0}
        return {"kv_device": kv["device"], "kv_host": kv["host"], "kv_disk": kv["disk"],
                "context_tokens": len(self._cached_ids),
                "max_context": self.max_context if self.document_tokens else 0,
                "host_attention_ms": self._host_ms_per_token}

    # -- snapshots: save / restore the document's KV cache (engine.store.snapshots, engine.store.restore) ---
    def snapshot_identity(self) -> SnapshotIdentity:
        """What a snapshot of this document must match (model, dtype, tokenizer, ids); computed once per document."""
        if not self._document_ids:
            raise StateError("no document: call set_document first")
        if self._identity is None:
            self._identity = SnapshotIdentity.of(self.model, self.tokenizer, self._document_ids)
        return self._identity

    def find_snapshot(self, store: SnapshotStore) -> SnapshotInfo | None:
        """The snapshot ``store`` holds for this document, if any (damaged ones too)."""
        if self.cache is None or not self.document_tokens:
            return None
        return store.find(self.snapshot_identity())

    def save_snapshot(self, store: SnapshotStore, label: str | None = None,
                      sidecar: tuple[tuple[str, str], ...] = ()) -> SnapshotInfo | None:
        """Saves the prefilled document's K/V to ``store``; None when it exceeds the store's size cap.

        ``label`` names it in ``store.list()`` (default: the start of the document). ``sidecar``: (file name,
        text) pairs saved inside the snapshot, durably, before it appears (``SnapshotStore.save``).
        """
        if not self.is_prefilled:
            raise StateError("prefill the document before saving a snapshot of it")
        return store.save(self.cache, self._document_ids, self.snapshot_identity(),
                          label=self.document if label is None else label, policy=dataclasses.asdict(self.policy),
                          sidecar=sidecar)

    def restore_snapshot(self, store: SnapshotStore) -> RestoreStats | None:
        """Restores the document's K/V from ``store`` instead of prefilling; afterwards it is prefilled, or for a
        partial read (``stats.num_tokens`` short of the document) ``prefill`` continues it.

        Returns None when there is nothing usable (none saved, or one that cannot load: logged, and a
        damaged one deleted), so the caller prefills as usual.
        """
        if self.cache is None:
            raise StateError("no document: call set_document first")
        info = self.find_snapshot(store)
        if info is None:
            return None
        try:
            stats = restore_document(store, self.cache, self.snapshot_identity(), info)
            if stats is not None:  # a partial read restores its first tokens: ``prefill`` continues from there
                self._cached_ids = list(self._document_ids[: stats.num_tokens])
                if self.is_prefilled:
                    self.cache.anchor(self.document_tokens)
            return stats
        finally:
            # A failed read may have emptied the cache: the ids must never claim K/V it no longer holds.
            del self._cached_ids[self.cache.get_seq_length():]
