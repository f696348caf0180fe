"""What a C build is of (``engine.native.library.source_bytes``): the source and every local header it includes, its
headers' headers too, so an edit of a shared header (``native/common.h``, which ``split_pool.h`` includes) gives
every library built over it a new name and a new crash probe."""

from __future__ import annotations

from pathlib import Path

from engine.cpu import gguf_blocks, int8_matmul
from engine.native import library

NATIVE = Path(library.__file__).parent


def test_a_header_included_by_a_header_is_part_of_the_build(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "shared" / "inner.h").write_text("static int inner(void) { return 1; }\n")
    (tmp_path / "shared" / "outer.h").write_text('#include "inner.h"\n#include "inner.h"\n')
    source = tmp_path / "kernels" / "k.c"
    source.write_text('#include "../shared/outer.h"\nint k(void) { return inner(); }\n')
    before = library.source_digest(source)
    assert library.source_bytes(source).count(b"static int inner") == 1  # a header named twice counts once
    (tmp_path / "shared" / "inner.h").write_text("static int inner(void) { return 2; }\n")
    assert library.source_digest(source) != before


def test_the_weights_kernels_builds_are_of_the_shared_helpers():
    common = (NATIVE / "common.h").read_bytes()
    for source in (gguf_blocks._SOURCE, int8_matmul._SOURCE):
        assert common in library.source_bytes(source), source.name
