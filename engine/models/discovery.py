"""Models already on this machine: the Hugging Face cache, LM Studio's and Ollama's model folders, user folders.

Each becomes a catalogue ``Entry`` built from its config alone: a Hub snapshot's ``config.json``, or a GGUF
file's header (read through ``gguf``'s memory-mapped reader: no tensor data is touched). Nothing found here is
loaded; the picker plans it like a curated entry.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

from engine.models.catalogue import Entry
from engine.planning.shape import ModelShape

logger = logging.getLogger(__name__)

#: GGUF ``general.architecture`` -> transformers ``model_type``
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                      "gemma3": "gemma3_text", "phi3": "phi3", "qwen3moe": "qwen3_moe", "glm4": "glm4"}
#: layers per global layer of the Gemma families, which GGUF headers do not state
_SLIDING_EVERY = {"gemma2": 2, "gemma3": 6}


def default_folders() -> dict[str, list[Path]]:
    """Where LM Studio and Ollama keep models, on Linux, macOS and Windows (``OLLAMA_MODELS`` wins)."""
    home = Path.home()
    ollama = [Path(os.environ["OLLAMA_MODELS"])] if os.environ.get("OLLAMA_MODELS") else [
        home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    return {"LM Studio": [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"], "Ollama": ollama}


def discover(user_folders: Iterable[str | Path] = (), *, hf_cache: Path | None = None,
             folders: dict[str, list[Path]] | None = None) -> list[Entry]:
    """Every model found: Hub cache snapshots, LM Studio / Ollama GGUFs, and models in ``user_folders``.
    An unreadable one is logged and skipped, never fatal."""
    found: list[Entry] = []
    found += _hub_cache(hf_cache)
    for app, places in (folders if folders is not None else default_folders()).items():
        for place in places:
            found += _ollama(place) if app == "Ollama" else _gguf_tree(place, app)
    for folder in user_folders:
        found += _user_folder(Path(folder).expanduser())
    return found


def _hub_cache(cache: Path | None) -> list[Entry]:
    try:
        from huggingface_hub import scan_cache_dir  # start-up time: only the picker scans the Hub cache

        info = scan_cache_dir(cache)
    except Exception as error:  # no cache yet, or an unreadable one
        logger.debug("no Hugging Face cache: %s", error)
        return []
    entries = []
    for repo in info.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda r: r.last_modified)
        entry = config_entry(Path(revision.snapshot_path), repo.repo_id, "Hugging Face cache")
        if entry is not None:
            entries.append(entry)
    return entries


def _user_folder(folder: Path) -> list[Entry]:
    if (folder / "config.json").is_file():
        entry = config_entry(folder, folder.name, "folder")
        return [entry] if entry else []
    entries = [e for sub in sorted(p for p in folder.glob("*/") if (p / "config.json").is_file())
               if (e := config_entry(sub, sub.name, "folder"))]
    return entries + _gguf_tree(folder, "folder")


def _gguf_tree(folder: Path, source: str) -> list[Entry]:
    if not folder.is_dir():
        return []
    return [e for path in sorted(folder.rglob("*.gguf")) if (e := gguf_entry(path, path.stem, source))]


def _ollama(models: Path) -> list[Entry]:
    """Ollama keeps GGUFs as content-addressed blobs; its manifests name them (``library/<name>/<tag>``)."""
    manifests = models / "manifests"
    if not manifests.is_dir():
        return []
    entries = []
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        try:
            layers = json.loads(manifest.read_text()).get("layers", [])
        except (OSError, ValueError):
            continue
        for layer in layers:
            if layer.get("mediaType") == "application/vnd.ollama.image.model":
                blob = models / "blobs" / layer["digest"].replace(":", "-")
                name = f"{manifest.parent.name}:{manifest.name}"
                if blob.is_file() and (entry := gguf_entry(blob, name, "Ollama")):
                    entries.append(entry)
    return entries


def config_entry(folder: Path, name: str, source: str) -> Entry | None:
    """An entry from a folder's ``config.json`` (the text model's part for multimodal ones)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config") or config
    if "num_hidden_layers" not in text:
        return None
    text = {"model_type": text.get("model_type", config.get("model_type")), **text}
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    params = weights // (4 if "32" in dtype else 2) if weights else _estimated_params(text)
    return Entry(name, text["model_type"] or "?", text, int(params), round(weights / 1e9, 2) if weights else None,
                 "see the model card", source=source, location=str(folder))


def gguf_entry(path: Path, name: str, source: str) -> Entry | None:
    """An entry from a GGUF header: the architecture's keys as config fields, parameters from the tensor shapes.

    Parsing a header takes seconds (a 150K-token vocabulary is a field of it), so each file is read once per
    process, while its size and modification time stay the same."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return _gguf_entry(str(path), stat.st_size, stat.st_mtime_ns, name, source)


@lru_cache(maxsize=256)
def _gguf_entry(file: str, size: int, mtime_ns: int, name: str, source: str) -> Entry | None:
    path = Path(file)
    try:
        from gguf import GGUFReader  # optional dependency: reading a .gguf header

        reader = GGUFReader(str(path))
        arch = _field(reader, "general.architecture")
        key = lambda k: _field(reader, f"{arch}.{k}")  # noqa: E731
        heads = int(key("attention.head_count"))
        hidden = int(key("embedding_length"))
        config = {"model_type": GGUF_ARCHITECTURES.get(arch, arch), "num_hidden_layers": int(key("block_count")),
                  "num_attention_heads": heads, "num_key_value_heads": int(key("attention.head_count_kv") or heads),
                  "head_dim": int(key("attention.key_length") or hidden // heads), "hidden_size": hidden,
                  "intermediate_size": int(key("feed_forward_length")),
                  "max_position_embeddings": int(key("context_length")),
                  "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data)}
        window = key("attention.sliding_window")
        if window and arch in _SLIDING_EVERY:
            config.update(sliding_window=int(window), sliding_every=_SLIDING_EVERY[arch])
        params = sum(int(t.n_elements) for t in reader.tensors)
        license_ = _field(reader, "general.license") or "see the model card"
    except Exception as error:  # not a GGUF, a truncated download, an architecture without these keys
        logger.info("skipping %s: %s", path, error)
        return None
    return Entry(name, arch, config, params, round(size / 1e9, 2), str(license_), source=source,
                 location=str(path))


def _field(reader, name: str):
    field = reader.fields.get(name)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(value).decode("utf-8", errors="replace")
    return value[0] if len(value) == 1 else value


def _estimated_params(config: dict) -> int:
    try:
        return ModelShape.from_config(SimpleNamespace(**config)).num_params
    except (AttributeError, TypeError, ValueError):
        return 0
