"""Model stores as Ollama and LM Studio leave them, built around real GGUF bytes, for the discovery and browser tests.

Ollama (its ``server/download.go`` and ``types/model/name.go``): ``blobs/sha256-<digest>`` files, written as
``sha256-<digest>-partial`` (+ ``-partial-N`` part files) and renamed once complete, and a JSON manifest per
``manifests/<host>/<namespace>/<model>/<tag>`` written last, whose ``application/vnd.ollama.image.model`` layer is the
GGUF. LM Studio (its "sideload" documentation): ``~/.lmstudio/models/<publisher>/<model>/<file>.gguf``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np


def write_gguf(path: Path, *, arch: str = "llama", layers: int = 3, context: int = 8192, vocab: int = 50,
               tensors: int = 1, license_: str | None = None) -> Path:
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), arch)
    if arch != "clip":
        writer.add_block_count(layers)
        writer.add_head_count(8)
        writer.add_head_count_kv(2)
        writer.add_embedding_length(256)
        writer.add_feed_forward_length(512)
        writer.add_context_length(context)
        writer.add_token_list([f"t{i}" for i in range(vocab)])
    if license_:
        writer.add_license(license_)
    for i in range(tensors):
        writer.add_tensor(f"blk.{i}.weight", np.ones((vocab, 256), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def link(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copyfile(source, target)
    return target


class OllamaStore:
    """An Ollama models folder: blobs named by digest, manifests by host / namespace / model / tag."""

    def __init__(self, root: Path):
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)

    def blob(self, data: bytes | Path) -> dict:
        raw = data.read_bytes() if isinstance(data, Path) else data
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        target = self.root / "blobs" / digest.replace(":", "-")
        if target.exists():  # another tag of the same blob
            pass
        elif isinstance(data, Path):
            link(data, target)
        else:
            target.write_bytes(raw)
        return {"digest": digest, "size": len(raw)}

    def pull(self, name: str, model: Path | None, *, host: str = "registry.ollama.ai", namespace: str = "library",
             model_size: int | None = None, adapter: bytes | None = None) -> Path:
        """What ``ollama pull name:tag`` leaves: the model blob, license, template and params layers, a manifest."""
        repo, tag = name.split(":")
        layers = []
        if model is not None:
            layer = {"mediaType": "application/vnd.ollama.image.model", **self.blob(model)}
            layer["size"] = model_size or layer["size"]
            layers.append(layer)
        if adapter is not None:  # what ``ADAPTER`` in a Modelfile adds
            layers.append({"mediaType": "application/vnd.ollama.image.adapter", **self.blob(adapter)})
        layers += [{"mediaType": "application/vnd.ollama.image.license", **self.blob(b"Apache License 2.0\n")},
                   {"mediaType": "application/vnd.ollama.image.template",
                    **self.blob(b"{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>{{ end }}")},
                   {"mediaType": "application/vnd.ollama.image.params", **self.blob(b'{"stop": ["<|im_end|>"]}')}]
        config = {"mediaType": "application/vnd.docker.container.image.v1+json",
                  **self.blob(b'{"model_format": "gguf", "model_family": "llama"}')}
        manifest = self.root / "manifests" / host / namespace / repo / tag
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"schemaVersion": 2, "mediaType":
                                        "application/vnd.docker.distribution.manifest.v2+json",
                                        "config": config, "layers": layers}))
        return manifest
