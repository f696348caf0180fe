"""Benchmark harness for HeadInfer Studio (issue 5); the entry point is ``python -m benchmarks.run``.

How we measure is described in ``shared/GPU.md``. Results go to ``docs/benchmarks/`` as an append-only JSON list
of records, a markdown table and plots. Pieces:

- ``records``  run stamp, the append-only results file, resume keys
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
- ``gpu_all``  every GPU measurement in one process with one deadline (one device call; ``gpu_session.sh`` wraps it)
- ``gpu_checks``  a filled-cache check against a reference attention, and the sanitizer workload

``parity`` and ``snapshot_bench`` are separate scripts with their own entry points.
"""

from cuda_alloc_env import use_expandable_segments

# Every entry point (``python -m benchmarks.<name>``) imports this package before any of its modules imports torch:
# the allocator settings the app runs with (``launch.py``) are the ones measured.
use_expandable_segments()
