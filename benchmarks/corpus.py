"""Real documents for the extraction tests and benchmark: manuals shipped in Debian packages.

``apt-get download`` fetches the packages (about 5 MB in all) and ``dpkg-deb -x`` unpacks them into
a cache folder, once; later calls only check that the files are there. Every document is a real
book made by real tool chains: LaTeX (dblatex, Sphinx) PDFs, a Sphinx EPUB, DocBook and Sphinx HTML.
"""

from __future__ import annotations

import fcntl
import gzip
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RealDocument:
    """One file of the corpus: ``package`` ships it at ``member`` (gzip-compressed when it ends in .gz)."""

    key: str
    package: str
    member: str
    what: str

    @property
    def file_name(self) -> str:
        return Path(self.member).name.removesuffix(".gz")


CORPUS = (
    RealDocument("reference-pdf", "debian-reference-en",
                 "usr/share/debian-reference/debian-reference.en.pdf", "Debian Reference 2.100, dblatex PDF"),
    RealDocument("policy-pdf", "debian-policy",
                 "usr/share/doc/debian-policy/policy.pdf.gz", "Debian Policy Manual 4.6.2.0, Sphinx LaTeX PDF"),
    RealDocument("maint-guide-pdf", "maint-guide",
                 "usr/share/doc/maint-guide/maint-guide.en.pdf", "Debian New Maintainers' Guide, dblatex PDF"),
    RealDocument("faq-pdf", "debian-faq",
                 "usr/share/doc/debian/FAQ/debian-faq.en.pdf.gz", "Debian FAQ, LaTeX PDF"),
    RealDocument("policy-epub", "debian-policy",
                 "usr/share/doc/debian-policy/policy.epub", "Debian Policy Manual, Sphinx EPUB"),
    RealDocument("reference-html", "debian-reference-en",
                 "usr/share/debian-reference/ch05.en.html", "Debian Reference chapter 5, DocBook HTML"),
    RealDocument("policy-html", "debian-policy",
                 "usr/share/doc/debian-policy/policy.html/ch-files.html", "Debian Policy chapter 10, Sphinx HTML"),
)  # fmt: skip


class CorpusUnavailable(RuntimeError):
    """The packages could not be downloaded or unpacked here (no apt, no network)."""


def fetch_corpus(folder: Path) -> dict[str, Path]:
    """Download and unpack the corpus into ``folder`` (kept between runs); ``key -> file``.

    Raises:
        CorpusUnavailable: with the reason, when apt-get or dpkg-deb is missing, the download
            fails, or this Debian release ships the manuals elsewhere.
    """
    folder = Path(folder)
    files = {document.key: folder / "files" / document.file_name for document in CORPUS}
    if all(path.is_file() for path in files.values()):
        return files
    folder.mkdir(parents=True, exist_ok=True)
    # Parallel test workers share the folder: one downloads and unpacks, the others wait and find the files.
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _fetch(folder, files)
    return files


def _fetch(folder: Path, files: dict[str, Path]) -> None:
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise CorpusUnavailable(f"{tool} not found: the real documents come from Debian packages")
    debs, unpacked = folder / "debs", folder / "unpacked"
    debs.mkdir(parents=True, exist_ok=True)
    (folder / "files").mkdir(exist_ok=True)
    packages = sorted({document.package for document in CORPUS})
    missing = [package for package in packages if not any(debs.glob(f"{package}_*.deb"))]
    if missing:
        _run(["apt-get", "download", *missing], cwd=debs)
    for document in CORPUS:
        target = files[document.key]
        if target.is_file():
            continue
        (deb,) = debs.glob(f"{document.package}_*.deb")
        root = unpacked / document.package
        if not (root / document.member).is_file():
            root.mkdir(parents=True, exist_ok=True)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, capture_output=True)
        source = root / document.member
        if not source.is_file():
            raise CorpusUnavailable(f"{deb.name} does not ship {document.member} (another Debian release?)")
        partial = target.with_suffix(target.suffix + ".partial")
        with (gzip.open(source) if document.member.endswith(".gz") else source.open("rb")) as reader:
            partial.write_bytes(reader.read())
        partial.replace(target)


def _run(command: list[str], cwd: Path) -> None:
    """Runs a download; what can fail for want of network or apt lists is "unavailable", not a bug."""
    log.info("running %s", " ".join(command))
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CorpusUnavailable(f"{' '.join(command[:2])} failed: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise CorpusUnavailable(f"{' '.join(command[:2])} failed (exit {done.returncode}): {' / '.join(tail)}")
