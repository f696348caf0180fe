"""Two manual pages for the support signals' tests: a copied neighbour's answer ("R 4.1.3", given for 32-bit
Windows) sits on page 1, the entity asked about (macOS) on page 2."""

DOCUMENT = """[page 1]
3 Installing R under Windows
R 4.1.3 was the last version of R to support 32-bit Windows. Rtools uses GCC 10.3.0 there.
[page 2]
4 Installing R under macOS
The macOS build needs macOS 10.13 or later; Xcode provides clang.
Some other line.
"""
PAGE_1 = (DOCUMENT.index("3 Inst"), DOCUMENT.index("[page 2]"))  # character span of page 1's text
PAGE_2 = (DOCUMENT.index("4 Inst"), len(DOCUMENT))


def asked_and_cleared(model, tokenizer):
    """A tiny session that read 120 words, answered one question and started a new conversation: (session, the
    answer's text, the cache's length now, the ids of the next question's turn) for teacher-forced scoring."""
    from tiny_sessions import prefilled_session, words_text

    session = prefilled_session(model, tokenizer, words_text(7, 120))
    *_, last = session.ask("w3 w4 w5", max_new_tokens=6)
    session.new_conversation()
    context = session.prompts.conversation_ids(session.document, [], "w9 w10 w11")
    return session, last.text, session.cache.get_seq_length(), context


def stock_logprobs(folder, ids: list[int], target: list[int]) -> list[float]:
    """Stock transformers' log-probs of ``target``, the last tokens of ``ids``, in one eager fp32 forward."""
    import torch
    from transformers import AutoModelForCausalLM

    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.inference_mode():
        logits = stock(torch.tensor([ids])).logits[0].float()
    picked = torch.log_softmax(logits, -1)[len(ids) - len(target) - 1: -1].gather(1, torch.tensor(target)[:, None])
    return picked[:, 0].tolist()
