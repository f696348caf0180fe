"""The self-check: is the engine exact on this machine, with the features the user turned on?

On the first use of a CUDA device (and on ``python launch.py --self-check``) tiny random models run through the
real stream path — fp32 and bf16, lag injected on the compute and copy streams (``streams="cuda-lagged"``) —
for every feature the policy enables (``selfcheck_cases``), compared with stock transformers; then the pinned
H2D/D2H and host-attention rates are measured. On a CPU the same cases run on emulated streams. The report is a
JSON file under the studio's cache folder, one per identity (GPU, driver, torch, transformers, engine sources,
features): a new driver or a changed engine checks again. A feature that gave a wrong result is turned off by
``disable``, with a logged message saying which and why — never wrong answers served in silence — and the stored
report remembers it. A case the check could not set up on this machine is *not checked*: the feature stays on
(a fault of the check says nothing about the feature) and the report says which.

See docs/self-check.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

from ..kv.pin_budget import pinning_is_capped
from ..models.quantized import QUANTIZED_MODES, Quantization, resolve
from ..paths import cache_dir
from ..planning.policy import OffloadPolicy
from ..planning.machine_rates import measure_copy_gbps, measure_h2d_gbps, measure_host_attention_gbps
from . import sysmem
from .cases import ARCH_FEATURES, FEATURES, CaseResult, TinyPair, case_policy, run_case, tiny_configs

logger = logging.getLogger(__name__)

_FOLDER = "self-check"
_ENGINE = Path(__file__).parent

# What turning a failed feature off means, and what the user is told.
_TURN_OFF = {
    "overlap": ({"overlap": False}, "the overlapped transfer schedule (copies on side streams while attention "
                                    "computes) gave wrong results: running without overlap (slower, exact)"),
    "host_attention": ({"host_attention": "off"}, "host attention (decode attending offloaded KV on the CPU) "
                                                  "gave wrong results: every offloaded head group is streamed"),
    "kv8": ({"kv_dtype": None}, "8-bit KV did not reproduce itself across streams: host KV stays in the model's "
                                "dtype (more host memory)"),
    "disk_tier": ({"disk_dir": None, "disk_memory": None}, "the disk tier gave wrong results: it is off, the "
                                                           "context is limited to what host memory holds"),
}


@dataclass(frozen=True)
class SelfCheckReport:
    identity: dict
    date: str  # UTC, YYYY-MM-DD
    device: str
    streams: str
    cases: list[CaseResult]
    rates: dict = field(default_factory=dict)  # GB/s: h2d, d2h, host_attention (CUDA only)
    seconds: float = 0.0

    @property
    def failed(self) -> list[str]:
        """The features to turn off (a wrong result in a case that ran), in ``FEATURES`` order."""
        bad = {case.feature for case in self.cases if case.checked and not case.passed}
        return [feature for feature in FEATURES if feature in bad]

    @property
    def unchecked(self) -> list[str]:
        """Features with a case that could not be set up here (left on, not verified), in ``FEATURES`` order."""
        missing = {case.feature for case in self.cases if not case.checked}
        return [feature for feature in FEATURES if feature in missing]

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def memory_warning(self) -> str | None:
        """Why this card's copies are slow (spilling into system memory, a slow link), from the rates; else None."""
        rates = self.rates
        return sysmem.verdict(rates.get("device_copy_gbps"), rates.get("h2d_gbps"), rates.get("link_gbps"),
                              wsl=sys.platform != "win32" and pinning_is_capped())

    def status_line(self) -> str:
        """A few words for the model header: ``exact on this GPU ✓ 2026-11-23`` or what failed."""
        where = "GPU" if self.device.startswith("cuda") else "CPU (emulated streams)"
        unchecked = f"; not checked: {', '.join(self.unchecked)}" if self.unchecked else ""
        if self.memory_warning is not None:  # exact, but not at the speed a read is planned for: said, not hidden
            unchecked += f"; slow: {self.memory_warning}"
        if self.passed:
            return f"exact on this {where} ✓ {self.date}{unchecked}"
        return f"self-check {self.date}: {', '.join(self.failed)} wrong on this {where}, turned off{unchecked}"

    def to_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "failed": self.failed, "unchecked": self.unchecked}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "SelfCheckReport":
        data = json.loads(text)
        data.pop("failed", None)
        data.pop("unchecked", None)
        data["cases"] = [CaseResult(**case) for case in data["cases"]]
        return cls(**data)


def enabled_features(policy: OffloadPolicy) -> list[str]:
    """The features the policy turns on (``overlap`` and host attention by default; 8-bit and disk when asked)."""
    wanted = {"overlap": policy.overlap, "host_attention": policy.host_attention != "off",
              "kv8": policy.kv_dtype is not None, "disk_tier": policy.disk_dir is not None}
    return [feature for feature in FEATURES if wanted[feature]]


def identity(policy: OffloadPolicy, device: torch.device, scheme: Quantization | None = None) -> dict:
    """What a report holds for: a new GPU, driver, torch, transformers or engine source checks again, and so do
    quantized weights (a scheme's own report)."""
    digest = hashlib.sha256()
    for path in sorted(_ENGINE.rglob("*")):
        if path.suffix in (".py", ".c"):
            digest.update(path.relative_to(_ENGINE).as_posix().encode() + b"\0" + path.read_bytes())
    is_cuda = device.type == "cuda"
    return {"gpu": torch.cuda.get_device_name(device) if is_cuda else f"cpu {platform.machine()}",
            "driver": _driver_version() if is_cuda else None, "torch": torch.__version__,
            "transformers": transformers.__version__, "engine": digest.hexdigest()[:16],
            "features": enabled_features(policy), "kv_dtype": policy.kv_dtype,
            **({"weights": scheme.name} if scheme is not None else {})}


def _scheme(weights: str, device: str | torch.device) -> Quantization | None:
    """The quantization scheme a weights mode names on ``device`` (``InputError`` if its library is missing), or
    None for weights that are not quantized by a library here (dense, the CPU's int8, GGUF blocks, published)."""
    return resolve(weights, str(device)) if weights in QUANTIZED_MODES else None


def report_path(ident: dict, folder: Path | None = None) -> Path:
    if folder is None:
        folder = cache_dir()
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return Path(folder) / _FOLDER / f"{key}.json"


def cached_report(policy: OffloadPolicy, device: str | torch.device, folder: Path | None = None,
                  weights: str = "dense"):
    """The stored report for this machine, policy and weights mode, or None."""
    path = report_path(identity(policy, torch.device(device), _scheme(weights, device)), folder)
    try:
        return SelfCheckReport.from_json(path.read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None


def first_use(policy: OffloadPolicy, device: str | torch.device, folder: Path | None = None,
              weights: str = "dense") -> SelfCheckReport | None:
    """On CUDA: the stored report, or a fresh check (tens of seconds, once per identity). On a CPU: None — a CPU
    start-up stays fast; CI and ``launch.py --self-check`` run it there. ``weights``: the served model's weights
    mode (``engine.models.weights_mode.weights_mode``); a quantized one is checked over tiny models quantized alike."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return cached_report(policy, device, folder, weights) or run_self_check(policy, device, folder=folder,
                                                                            weights=weights)


def run_self_check(policy: OffloadPolicy, device: str | torch.device, *, folder: Path | None = None,
                   dtypes: tuple[torch.dtype, ...] | None = None, archs: tuple[str, ...] | None = None,
                   weights: str = "dense") -> SelfCheckReport:
    """Runs every enabled feature's cases now and stores the report (replacing the one of the same identity).
    ``weights``: a quantized mode (``engine.models.quantized``) checks tiny models quantized by its library, head-wise
    against stock over the same quantized weights, in the dtypes it computes in; any other mode checks dense ones."""
    device = torch.device(device)
    is_cuda = device.type == "cuda"
    streams = "cuda-lagged" if is_cuda else "emulated"
    dtypes = dtypes or ((torch.float32, torch.bfloat16) if is_cuda else (torch.float32,))
    scheme = _scheme(weights, device)
    if scheme is not None and scheme.dtypes:
        dtypes = tuple(d for d in dtypes if str(d).removeprefix("torch.") in scheme.dtypes) or (torch.bfloat16,)
    ident = identity(policy, device, scheme)
    started = time.perf_counter()
    features = enabled_features(policy)
    cases: list[CaseResult] = []
    workdir = Path(tempfile.mkdtemp(prefix="headinfer-self-check-"))
    try:
        for dtype in dtypes:
            for arch in archs or tuple(tiny_configs()):
                pair = TinyPair.build(arch, dtype, device, scheme)
                overlap_ok = True
                for feature in [f for f in features if f in ARCH_FEATURES.get(arch, FEATURES)]:
                    # Once overlap failed, the other features are checked as they will run: without it.
                    feature_policy = case_policy(feature, policy, streams, overlap=overlap_ok)
                    result = run_case(feature, pair, feature_policy, workdir / f"{arch}-{feature}")
                    overlap_ok = overlap_ok and (feature != "overlap" or result.passed or not result.checked)
                    cases.append(result)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = SelfCheckReport(ident, datetime.datetime.now(datetime.timezone.utc).date().isoformat(), str(device),
                             streams, cases, _rates(device, "host_attention" in features) if is_cuda else {},
                             time.perf_counter() - started)
    _store(report, report_path(ident, folder))
    logger.info("self-check on %s (%s streams) in %.1f s: %s", device, streams, report.seconds, report.status_line())
    if report.memory_warning is not None:
        logger.warning("self-check: %s", report.memory_warning)
    for case in cases:
        if not case.checked:
            logger.warning("self-check could not set up %s on %s/%s, not checked (left on): %s", case.feature,
                           case.arch, case.dtype, case.error)
        elif not case.passed:
            logger.warning("self-check failed: %s on %s/%s (%s)", case.feature, case.arch, case.dtype,
                           case.error or f"logit error {case.max_rel_error:.2e}, greedy tokens "
                                         f"{'equal' if case.tokens_equal else 'differ'}")
    return report


def disable(policy: OffloadPolicy, failed: list[str]) -> OffloadPolicy:
    """``policy`` with every failed feature turned off, each with a logged message saying which and why."""
    for feature in failed:
        knobs, message = _TURN_OFF[feature]
        logger.warning("self-check: %s", message)
        policy = dataclasses.replace(policy, **knobs)
    return policy


def _rates(device: torch.device, host_attention: bool) -> dict:
    rates = {"h2d_gbps": measure_h2d_gbps(device, 64 << 20), "d2h_gbps": _measure_d2h_gbps(device, 64 << 20),
             "device_copy_gbps": sysmem.measure_device_copy_gbps(device)}
    link = sysmem.read_link(device.index or 0)
    if link is not None:
        rates["link_gbps"] = link
    if host_attention:
        rates["host_attention_gbps"] = measure_host_attention_gbps(tokens=1 << 16, repeats=3)
    return rates


def _measure_d2h_gbps(device: torch.device, num_bytes: int, repeats: int = 5) -> float:
    """Device-to-pinned-host copy rate (median), timed with CUDA events."""
    source = torch.empty(num_bytes, dtype=torch.uint8, device=device).random_()
    return measure_copy_gbps(torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True), source, repeats)


def _driver_version() -> str | None:
    try:
        return Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        query = getattr(torch._C, "_cuda_getDriverVersion", None)
        return str(query()) if query is not None else None


def _store(report: SelfCheckReport, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(report.to_json())
        temporary.replace(path)  # atomic: a concurrent reader sees the old report or the new one
    except OSError as error:  # a read-only home only costs a re-check next time
        logger.warning("could not store the self-check report in %s: %s", path, error)
