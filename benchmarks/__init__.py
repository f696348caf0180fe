"""Benchmarks for HeadInfer Studio; how we measure is described in ``shared/GPU.md``. Results go to
``docs/benchmarks/`` (append-only JSON records, markdown tables, plots).

- ``harness/``  the ``python -m benchmarks.harness.run`` harness (issue 5) and the one-call GPU session
  (``harness/gpu_all.py``; ``gpu_session.sh`` wraps it, ``fetch_gpu_wheels.sh`` fills its wheels)
- ``weights/``  studies of holding and loading weights (load, switch, GGUF, llama.cpp, CPU dtype)
- ``disk/``     studies of the disk (rates, snapshots, checkpoints, capacity)
- ``tables/``   scripts printing a table from configs alone (ledger, picker)
- at the top: ``records`` (run stamp, the append-only results file, resume keys) and ``corpus`` (real documents),
  which every study uses, and the one-file studies (``niah``, ``estimates``, ``estimate_error``, ``parity``, ...)

Every study is its own entry point: ``python -m benchmarks.<name>`` or ``python -m benchmarks.<group>.<name>``.
The rules the tests read from the imports live in ``tests/helpers/structure.py``.
"""

from process_env import use_expandable_segments

# Every entry point (``python -m benchmarks.<name>``) imports this package before any of its modules imports torch:
# the allocator settings the app runs with (``launch.py``) are the ones measured. Only those: the OpenMP and malloc
# settings go to "ours" children alone (``process_env.for_children``), never to stock's or llama.cpp's.
use_expandable_segments()
