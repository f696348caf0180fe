"""Scripts that print a table from configs alone (no timing): the allocation ledger (``ledger_table``) and the
picker's table for a stated machine (``picker_table``). ``python -m benchmarks.tables.<name>``."""
