"""A follow-up question over a ~5K-token document already read: time to first token through the official ``openai``
client (``launch.py --api``) against the page's own follow-up, on the same app and the same K/V.

    python -m benchmarks.serving.api_follow_up [--reps 3 --tokens 5000]

``launch.py --api`` serves the embedded SmolLM2-135M (CPU) in a process of its own (``benchmarks.app.load_visitors``'
``running_app``). A page tab (``gradio_client``, as a browser tab) uploads and reads a generated note of about
``--tokens`` tokens. Each round, on the page: New chat, the first question (not timed), then a follow-up, timed by
the page's own stats line (TTFT from the ask) and by the client (submit to the first streamed token). Then through
the API: the first question in the page's layout (``GET /v1/documents``' messages; it reuses the tab's document),
then a different follow-up after the API's own first answer, timed from the request to the first streamed token.
Both follow-ups compute their own question's tokens only: the page's from its conversation, the API's from the
document and the earlier turn already held (the ``headinfer.reused_tokens`` it reports). Greedy, no repetition guard
on either side. Writes docs/benchmarks/api-follow-up.md (and data/api-follow-up.json).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import openai
from gradio_client import Client, handle_file

from ..app.load_visitors import LoadConfig, follow, running_app
from ..records import machine_line, run_stamp
from ..harness.layout import data_file

FIRST = "Who keeps the lighthouse at Kerrow Point?"
FOLLOW_UPS = ("What is the secret launch code?", "In which year was the lighthouse built?",
              "What does the keeper do every evening?", "How many ships passed in the storm?")
TTFT = re.compile(r"TTFT (\d+\.\d+) s")


def note(num_tokens: int) -> str:
    """A note of about ``num_tokens`` tokens (SmolLM2's tokenizer: ~3 characters a token of these numbered lines)."""
    facts = ("The lighthouse on Kerrow Point was built in 1871. Its keeper, Mara, trims the wick every evening. "
             "The secret launch code of the lighthouse is AMBER-7. In the great storm forty ships passed safely.\n")
    days = [f"Day {day}: the keeper logged the weather ({('fair', 'rain', 'fog', 'gale')[day % 4]}), "
            f"the tide at {day % 12 + 1} o'clock and {day * 7 % 31} passing boats.\n" for day in range(1, 2000)]
    text, body = facts, iter(days)
    while len(text) < num_tokens * 3.0:
        text += next(body)
    return text


def _message_text(message: dict) -> str:
    content = message["content"]
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def page_ask(tab: Client, question: str, history: list) -> tuple[list, float | None, float | None]:
    """Asks on the page; returns (chat, the page's TTFT, the client's time to the first streamed token)."""
    sent, first = time.monotonic(), []

    def on_output(output, at: float) -> bool:
        chat = output[0]
        if not first and chat and chat[-1]["role"] == "assistant":
            text = re.sub(r"<[^>]+>", "", _message_text(chat[-1])).strip()
            if text and not text.startswith(("…", "⏳")):
                first.append(at - sent)
        return False

    job = tab.submit(question, history, 24, 0.0, False, False, api_name="/ask")  # greedy, no guard, no sources
    follow(job, time.monotonic() + 900, on_output)
    chat, _, status, _ = job.outputs()[-1]
    found = TTFT.search(re.sub(r"<[^>]+>", "", str(status)))
    return chat, float(found.group(1)) if found else None, first[0] if first else None


def api_ask(client: openai.OpenAI, model: str, messages: list) -> tuple[str, float, dict]:
    """Streams a chat through the ``openai`` client; returns (answer, time to its first token, our extras)."""
    sent, first, text, extra = time.monotonic(), None, [], {}
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0,
                                                stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.monotonic() - sent
            text.append(chunk.choices[0].delta.content)
        extra = (chunk.model_extra or {}).get("headinfer") or extra
    return "".join(text), first, extra


def one_round(tab: Client, client: openai.OpenAI, model: str, prefix: list, round_: int) -> dict:
    tab.predict(api_name="/new_chat")
    chat, _, _ = page_ask(tab, FIRST, [])
    _, page_ttft, page_client = page_ask(tab, FOLLOW_UPS[round_ % len(FOLLOW_UPS)], chat)
    messages = [dict(m) for m in prefix]
    messages[-1]["content"] += FIRST
    first_answer, _, _ = api_ask(client, model, messages)
    messages += [{"role": "assistant", "content": first_answer},
                 {"role": "user", "content": FOLLOW_UPS[(round_ + 1) % len(FOLLOW_UPS)]}]
    _, api_client, extra = api_ask(client, model, messages)
    return {"page_ttft": page_ttft, "page_client": page_client, "api_client": api_client,
            "reused": extra.get("reused_tokens"), "computed": extra.get("computed_prompt_tokens")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=5000)
    parser.add_argument("--out", default="docs/benchmarks")
    args = parser.parse_args(argv)
    stamp = run_stamp("cpu")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kerrow-log.txt"
        path.write_text(note(args.tokens))
        config = LoadConfig(host="127.0.0.1", app_args=("--api",))
        with running_app(Path(folder), config) as (url, _, _):
            base = url.rstrip("/")
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=900, max_retries=0)
            model = client.models.list().data[0].id
            tab = Client(url, verbose=False)
            tab.predict([handle_file(str(path))], api_name="/upload")
            tab.submit(False, api_name="/read").result(timeout=1800)
            listed = next(d for d in httpx.get(f"{base}/v1/documents", timeout=60).json()["data"]
                          if d["kind"] == "tab")
            rows = [one_round(tab, client, model, listed["messages"], r) for r in range(args.reps)]
            tab.close()
    write(Path(args.out), stamp, listed["tokens"], rows)
    return 0


def write(out: Path, stamp: dict, tokens: int, rows: list[dict]) -> None:
    data_file(out, "api-follow-up.json").write_text(json.dumps({"run": stamp, "document_tokens": tokens, "rows": rows},
                                                       indent=1))
    med = {key: statistics.median(r[key] for r in rows if r[key] is not None) for key in
           ("page_ttft", "page_client", "api_client")}
    lines = ["# A follow-up over a document already read: the API's first token against the page's", "",
             machine_line(stamp), "", f"Document: {tokens:,} tokens, read once in a page tab; "
             "SmolLM2-135M on the CPU (launch.py's default there: its GGUF's Q4_1 blocks); greedy 24-token answers; "
             "`python -m benchmarks.serving.api_follow_up`. The page's follow-up and the API's each compute their own "
             "question's tokens beside the held document and first turn.", "",
             "| round | page TTFT (its stats line) | page, client-side | API via `openai`, client-side | "
             "API reused / computed prompt tokens |", "|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        lines.append(f"| {i} | {r['page_ttft']:.2f} s | {r['page_client']:.2f} s | {r['api_client']:.2f} s | "
                     f"{r['reused']:,} / {r['computed']:,} |")
    lines += ["", f"Medians: page {med['page_ttft']:.2f} s (stats line), {med['page_client']:.2f} s (client); API "
              f"{med['api_client']:.2f} s: {med['api_client'] / med['page_ttft']:.2f}x the page's own TTFT, "
              f"{med['api_client'] / med['page_client']:.2f}x its client-side time (target: within 1.5x)."]
    (out / "api-follow-up.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
