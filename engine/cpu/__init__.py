"""The CPU weights runtime: a model's linear layers on the CPU as int8 codes (``int8``, ``int8_matmul`` +
``int8_gemv.c``) or as its GGUF file's own blocks (``gguf_blocks`` + ``gguf_gemv.c``), oneDNN's fp32 matmul for a
prefill chunk (``cpu_matmul``), and a decode layer fused around the cache's attention (``fused_decode`` +
``gguf_decode.h``). Below ``models/`` (which loads and matches weights, then installs these layers) and the
session (which runs the fused step): it imports neither, only the KV's kernels and ``native/``. Internal: the app
never imports it."""
