"""The shared tools of the studies (issue 5; issue 52: only the tools), and the ``python -m benchmarks.harness.run``
entry point of the GPU phases and the CPU smoke.

- ``run``      the entry point: CPU smoke or GPU phases, results to ``docs/benchmarks/``
- ``layout``   where a study's files go: reports at the top of ``docs/benchmarks/``, their data in ``data/``
- ``floors``   pure math: FLOPs, hardware floors and ratios
- ``search``   pure largest-context search (doubling then bisection, time-capped)
- ``timing``   warm-up / median-of-N timing and per-phase peak memory
- ``models``   the Llama-3-8B-shaped random model, tiny test models, SmolLM2
- ``modes``    the inference modes (standard, chunked, layer-wise, head-wise) and their caches
- ``fill``     caches filled with random K/V (decode timing without a long prefill)
- ``probes``   one measurement each: a timed prefill, timed decode steps, a memory-frontier probe
- ``sweeps``   GPU phases over modes x lengths, with time limits and resume
- ``ceilings`` link bandwidth, matmul and attention rates, pinned host memory
- ``trace``    torch.profiler summary and H2D/kernel overlap
- ``report``   markdown tables and plots
- ``smoke``    the CPU variant (SmolLM2 or a tiny random Llama)
- ``junit``    a pytest JUnit report as a ``parity`` record

The one-call GPU session (``gpu_all`` and its steps) is in ``benchmarks/gpu/``, the host-attention studies in
``benchmarks/cpu/``.
"""
