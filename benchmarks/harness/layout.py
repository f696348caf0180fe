"""Where a study's files go (issue 52): the reports (markdown) at the top of ``docs/benchmarks/``, the records, logs
and plots they are made from in its ``data/``, a GPU run's files together in ``runs/<date>/``. Torch-free: a
study's parent process imports it before its children load torch."""

from __future__ import annotations

import os
from pathlib import Path

#: the subfolder of a reports folder that holds the records, logs and plots its reports are made from
DATA = "data"


def data_file(out: str | os.PathLike, name: str) -> Path:
    """Where a study writes ``name`` (records, a log, a plot) under its ``--out`` folder: in ``data/`` where the folder
    keeps its data there (``docs/benchmarks``: the reports at the top, their data below), else beside the report (a
    test's tmp folder, a GPU run's folder under ``runs/``)."""
    return data_folder(out) / name


def data_folder(out: str | os.PathLike) -> Path:
    """The folder ``data_file`` puts a study's data in."""
    folder = Path(out)
    return folder / DATA if (folder / DATA).is_dir() else folder


def report_of(records: str | os.PathLike) -> Path:
    """The markdown report of a records file: ``docs/benchmarks/data/x.json`` -> ``docs/benchmarks/x.md``; a records
    file in any other folder gets its report beside it."""
    records = Path(records)
    folder = records.parent.parent if records.parent.name == DATA else records.parent
    return folder / f"{records.stem}.md"


def cited(path: str | os.PathLike, report: str | os.PathLike) -> str:
    """``path`` as ``report`` names it: relative to the report's folder (``data/x.json``)."""
    return Path(os.path.relpath(Path(path).resolve(), Path(report).resolve().parent)).as_posix()
