"""A pytest JUnit XML report turned into the metrics of one ``parity`` record."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path


def summarize_junit(path: str | Path) -> dict:
    """Counts and the ids of failing tests (``file::name``) from ``pytest --junitxml``."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failed": 0, "skipped": 0}
    failures, seconds = [], 0.0
    for suite in suites:
        counts["tests"] += int(suite.get("tests", 0))
        counts["failed"] += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        counts["skipped"] += int(suite.get("skipped", 0))
        seconds += float(suite.get("time", 0) or 0)
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failures.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    passed = counts["tests"] - counts["failed"] - counts["skipped"]
    return {**counts, "passed": passed, "failures": failures, "seconds": seconds}
