"""The claim check: after an answer, is *that* answer stated in the document for what the question asks about?

The support flag's other signals read how the answer was made (its attention on the pages, its token log-probs);
an answer copied from a neighbouring page under another entity ("GCC 10.3.0" asked for macOS, the page giving it for
Windows) is made as surely as a right one. This check asks the model itself, on the document's cached K/V, one
yes/no turn that names both the question and the answer, and reads P(yes) off the next token
(``support.yes_share``): a prefill of the turn's few dozen tokens, no answer regenerated.
"""

from __future__ import annotations

# After the answer (the conversation holds it): the model judges its own last reply.
CLAIM_AFTER_PROMPT = ("Check your last answer against the document. Does the document itself give that answer for "
                      "exactly what was asked ({question}), and not for a different program, platform, version or "
                      "person mentioned nearby? Answer yes or no.")
# In a fresh chat (the document alone before it): the answer quoted as a claim to check.
CLAIM_PROMPT = ("Question: {question}\nProposed answer: {answer}\nDoes the document itself give this answer for "
                "exactly what the question asks about, and not for a different program, platform, version or person "
                "mentioned nearby? Answer yes or no.")


def claim_prompt(question: str, answer: str | None = None) -> str:
    """The claim check's turn: after the answer (``answer`` None: the conversation holds it) or quoting it."""
    if answer is None:
        return CLAIM_AFTER_PROMPT.format(question=question.strip())
    return CLAIM_PROMPT.format(question=question.strip(), answer=" ".join(answer.split()))
