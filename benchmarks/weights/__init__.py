"""Studies of how model weights are held and loaded: load time and memory (``model_load``), switching models
(``model_switch``), GGUF blocks (``gguf_weights``), llama.cpp on the same file (``llamacpp_compare``), the CPU
dtype (``cpu_dtype``). Each is its own entry point: ``python -m benchmarks.weights.<name>``."""
