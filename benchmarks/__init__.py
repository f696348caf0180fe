"""Benchmarks for HeadInfer Studio, by subject; how we measure: ``docs/benchmarks/method.md``. Reports go to
``docs/benchmarks/``, the records, logs and plots they are made from to ``docs/benchmarks/data/`` (append-only JSON
records), a GPU run's files to ``docs/benchmarks/runs/<date>/``.

- ``harness/``  the shared tools: the ``python -m benchmarks.harness.run`` entry point (issue 5), models, modes,
  timing, floors, reports and ``layout`` (where a study's files go)
- ``gpu/``      the one-call GPU session (``gpu/gpu_all.py``; ``gpu_session.sh`` wraps it, ``fetch_gpu_wheels.sh``
  fills its wheels), pinned memory as a budget, a prefill chunk's device memory
- ``cpu/``      host attention against the read, the CPU decode and prefill kernels, pools, prefetch hints
- ``weights/``  holding and loading weights (load, switch, GGUF, quantizers, llama.cpp on the same file, CPU dtype)
- ``quality/``  parity with stock, needle in a haystack, 8-bit KV quality, the model and support evaluations
  (``model_eval``, ``support_*``)
- ``app/``      the app's own work (reading documents, bombs, estimates, first start, the queue, many visitors)
- ``serving/``  the OpenAI-compatible endpoint against the page
- ``disk/``     the disk (rates, snapshots, checkpoints, capacity)
- ``tables/``   tables printed from configs alone (ledger, picker)
- at the top: ``records`` (run stamp, the append-only results file, resume keys) and ``corpus`` (real documents),
  which every study uses

Every study is its own entry point: ``python -m benchmarks.<folder>.<name>``; each folder's size is capped by
``tests/test_structure.py``. The rules the tests read from the imports live in ``tests/helpers/structure.py``.
"""

from process_env import use_expandable_segments

# Every entry point (``python -m benchmarks.<name>``) imports this package before any of its modules imports torch:
# the allocator settings the app runs with (``launch.py``) are the ones measured. Only those: the OpenMP and malloc
# settings go to "ours" children alone (``process_env.for_children``), never to stock's or llama.cpp's.
use_expandable_segments()
