"""Document extraction speed and quality on real books: pages/s and chars/s per format.

    .venv/bin/python -m benchmarks.app.extraction                 # about a minute on a 2-core CPU machine
    .venv/bin/python -m benchmarks.app.extraction --rounds 5

The books are Debian manuals (``benchmarks.corpus``: ``apt-get download``, cached in ``--folder``).
PDFs are read three ways, taking turns within each round so that load from other processes lands on
all alike: **before** (pypdf's ``extract_text``, what the app used until issue 10), PDFium's raw text,
and **after** (``app.documents.read_document``: PDFium, running headers/footers removed, hyphenation
undone, ``[page N]`` markers). EPUB and HTML are read by ``read_document`` before (as of commit
bd77602, loaded with ``git show``; skipped outside a git checkout) and after. Figures are medians.

Quality beside speed: words longer than 20 letters per 10,000 words (run-together words: real
English has almost none) and the running header/footer lines removed.
Writes ``docs/benchmarks/extraction.md`` and ``data/extraction.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import types
import warnings
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

from ebooklib import epub

from app.documents import read_document
from app.documents.pdf import pdfium_pages, pypdf_pages
from app.documents.pdf_layout import running_lines

from ..corpus import CORPUS, fetch_corpus
from ..harness.layout import data_file

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "benchmarks"
BASELINE_COMMIT = "bd77602"  # the last commit before issue 10's extraction work
logger = logging.getLogger("extraction_bench")


def run_together_per_10k(text: str) -> float:
    words = re.findall(r"[^\W\d_]+", text)
    return 10_000 * sum(1 for word in words if len(word) > 20) / max(len(words), 1)


def removed_lines(pages: list[str | None]) -> int:
    lines = [[line.strip() for line in (page or "").splitlines() if line.strip()] for page in pages]
    return sum(len(found) for found in running_lines(lines))


def baseline_reader(commit: str):
    """``read_document`` as of ``commit`` (pypdf, BeautifulSoup), from git; ``None`` outside a checkout."""
    try:
        source = subprocess.run(["git", "show", f"{commit}:app/documents.py"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        logger.warning("no baseline: git show %s:app/documents.py failed", commit)
        return None
    module = types.ModuleType("documents_before")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{commit}:app/documents.py", "exec"), module.__dict__)
    return module.read_document


def measure(files: dict[str, Path], rounds: int, baseline) -> list[dict]:
    methods = []  # (key, format, method, callable returning (pages, text))
    for document in CORPUS:
        path = files[document.key]
        if path.suffix == ".pdf":
            methods += [
                (document.key, "PDF", "before: pypdf", lambda p=path: _joined(pypdf_pages(p, p.name)[0])),
                (document.key, "PDF", "PDFium raw text", lambda p=path: _joined(pdfium_pages(p, p.name)[0])),
                (document.key, "PDF", "after: read_document", lambda p=path: _document(p)),
            ]
        else:
            kind, units = ("EPUB" if path.suffix == ".epub" else "HTML"), _units(path)
            if baseline is not None:
                methods.append((document.key, kind, f"before: read_document @{BASELINE_COMMIT}",
                                lambda p=path, units=units: _document(p, units, baseline)))
            methods.append((document.key, kind, "after: read_document",
                            lambda p=path, units=units: _document(p, units)))

    seconds: dict[int, list[float]] = {index: [] for index in range(len(methods))}
    outputs: dict[int, tuple[int | None, str]] = {}
    for round_number in range(rounds):
        for index, (key, _, method, run) in enumerate(methods):
            started = time.perf_counter()
            outputs[index] = run()
            seconds[index].append(time.perf_counter() - started)
            logger.info("round %d: %s / %s %.2f s", round_number + 1, key, method, seconds[index][-1])

    by_key = {document.key: document for document in CORPUS}
    results = []
    for index, (key, kind, method, _) in enumerate(methods):
        pages, text = outputs[index]
        median = statistics.median(seconds[index])
        row = {"document": key, "what": by_key[key].what, "format": kind, "method": method,
               "bytes": files[key].stat().st_size, "pages": pages, "chars": len(text),
               "seconds": round(median, 4), "runs": [round(s, 3) for s in seconds[index]],
               "pages_per_s": round(pages / median, 1) if pages else None,
               "chars_per_s": round(len(text) / median), "mb_per_s": round(files[key].stat().st_size / median / 1e6, 2),
               "run_together_per_10k": round(run_together_per_10k(text), 2)}
        if method == "PDFium raw text":
            row["running_lines_removed"] = removed_lines(pdfium_pages(files[key], key)[0])
        results.append(row)
    return results


def _joined(pages: list[str | None]) -> tuple[int, str]:
    return len(pages), "\n".join(page or "" for page in pages)


def _document(path: Path, units: int | None = None, reader=read_document) -> tuple[int | None, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the baseline's BeautifulSoup warns about XHTML
        document = reader(path)
    return document.pages or units, document.text


def _units(path: Path) -> int:
    """What stands for pages where there are none: an EPUB's spine chapters, one HTML file."""
    if path.suffix != ".epub":
        return 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return len(epub.read_epub(str(path), options={"ignore_ncx": True}).spine)


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu": cpu,
            "cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), "pypdfium2": version("pypdfium2"), "pypdf": version("pypdf"),
            "ebooklib": version("ebooklib"), "beautifulsoup4": version("beautifulsoup4")}


def markdown(stamp: dict, results: list[dict], rounds: int) -> str:
    lines = [
        "# Document extraction on real books (issue 10)", "",
        f"Measured {stamp['date']} on {stamp['cpu']} ({stamp['cores']} cores, shared with other jobs: load "
        f"average {stamp['load_average'][0]} at start, {stamp['load_end'][0]} at end), Python {stamp['python']}, "
        f"pypdfium2 {stamp['pypdfium2']}, pypdf {stamp['pypdf']}. Median of {rounds} rounds, methods taking "
        "turns within each round. Produced by `python -m benchmarks.app.extraction`.", "",
        "Books: Debian manuals from their packages (`benchmarks/corpus.py`). **before** is pypdf's "
        "`extract_text`, what the app used until issue 10; **after** is `read_document` (PDFium, running "
        "headers/footers removed, hyphenation undone, `[page N]` markers). Run-together: words longer than "
        "20 letters per 10,000 words. For EPUB and HTML, pages/s counts chapters (spine items) and files.", "",
        "| document | format | method | pages | chars | s | pages/s | chars/s | run-together /10k | headers removed |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in results:
        pages_per_s = f"{row['pages_per_s']:,.0f}"
        unit = {"EPUB": " chapters", "HTML": " file"}.get(row["format"], "")
        bold = "**" if row["method"].startswith("after") else ""
        lines.append(
            f"| {row['what']} | {row['format']} | {row['method']} | {row['pages']}{unit} | {row['chars']:,} | "
            f"{row['seconds']:.2f} | {bold}{pages_per_s}{bold} | {bold}{row['chars_per_s']:,}{bold} | "
            f"{row['run_together_per_10k']:.1f} | {row.get('running_lines_removed', '')} |")
    speedups = [(row["what"], after["pages_per_s"] / row["pages_per_s"])
                for row in results if row["method"].startswith("before")
                for after in results if after["document"] == row["document"] and after["method"].startswith("after")]
    if speedups:
        lines += ["", "Speed-up, after vs before (for PDFs the whole `read_document` vs pypdf's extraction alone; for "
                  f"EPUB and HTML vs `read_document` at {BASELINE_COMMIT}, BeautifulSoup's tree): "
                  + "; ".join(f"{what}: {factor:.1f}x" for what, factor in speedups) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=Path(".pytest_cache/d/debian-documents"),
                        help="where the Debian packages are downloaded and unpacked (the tests' cache)")
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    files = fetch_corpus(args.folder)
    stamp = machine()
    results = measure(files, args.rounds, baseline_reader(BASELINE_COMMIT))
    stamp["load_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.mkdir(parents=True, exist_ok=True)
    data_file(args.out, "extraction.json").write_text(json.dumps({"machine": stamp, "results": results}, indent=1) + "\n")
    report = markdown(stamp, results, args.rounds)
    (args.out / "extraction.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
