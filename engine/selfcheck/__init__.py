"""The self-check: tiny models through the real stream path, every feature the user enabled, compared with stock
(``launch.py --self-check``, and on the first use of a CUDA device); a failing feature is turned off."""

from .report import SelfCheckReport, disable, first_use, report_path, run_self_check

__all__ = ["SelfCheckReport", "disable", "first_use", "report_path", "run_self_check"]
