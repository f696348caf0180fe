"""A read that checkpoints and is killed: ``python checkpoint_child.py MODEL_DIR STORE TEXT_FILE POLICY_JSON``.

Run by ``test_checkpoint.py`` in a child process: it reads the document with a checkpoint after every chunk,
pausing between chunks so that the parent can ``SIGKILL`` it mid-read once a checkpoint has landed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/engine/helpers: tiny_sessions' tokenizer

from tiny_sessions import word_tokenizer  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from engine import DocumentSession, OffloadPolicy, SnapshotStore  # noqa: E402
from engine.types import CheckpointPlan  # noqa: E402


def main(model_dir: str, store_dir: str, text_file: str, policy: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="headinfer").eval()
    session = DocumentSession(model, word_tokenizer(), OffloadPolicy(**json.loads(policy)), answer_budget=32)
    session.set_document(Path(text_file).read_text())
    plan = CheckpointPlan(SnapshotStore(store_dir), every_chunks=1)
    session.prefill(give_way=lambda: time.sleep(0.4), checkpoints=plan)  # slow enough to be killed mid-read
    print("finished", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
