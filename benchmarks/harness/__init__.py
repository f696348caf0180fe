"""The ``python -m benchmarks.harness.run`` harness (issue 5) and the one-call GPU session (``gpu_all``).

- ``run``      the entry point: CPU smoke or GPU phases, results to ``docs/benchmarks/``
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
- ``gpu_all``  every GPU measurement in one process with one deadline (``benchmarks/gpu_session.sh`` wraps it)
- ``gpu_steps``, ``gpu_checks``, ``gpu_summary``  its steps, its filled-cache check, its summary table
- ``host_attention``  one layer's host attention against the read bandwidth (a gpu_all step; its own entry point)
"""
