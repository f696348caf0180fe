"""Studies of the disk: its read/write rates (``disk_io``, shared by the others), snapshots (``snapshot_bench``),
checkpoints (``checkpoint_cost``) and the capacity table (``capacity``). Each is its own entry point:
``python -m benchmarks.disk.<name>``."""
