"""Studies of how model weights are held and loaded: load time and memory (``model_load``), switching models
(``model_switch``), GGUF blocks on the CPU (``gguf_weights``) and on the device (``gguf_device``), the library
quantizers (``quantized_weights``), llama.cpp on the same file (``llamacpp_compare``, ``llamacpp_1_5b``), the CPU
dtype (``cpu_dtype``). Each is its own entry point: ``python -m benchmarks.weights.<name>``."""
