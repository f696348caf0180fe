"""OpenMP's idle policy, set before torch loads (this module imports no torch).

``OMP_WAIT_POLICY=PASSIVE``: torch's OpenMP threads sleep when a parallel region ends instead of spinning on their
cores. The engine's own C pools (the GGUF GEMVs', the host attention kernel's) run between torch's ops on those same
cores, and spinning OpenMP threads took them: on the 2-core EPYC VM the CPU default model's fused decode step at 2K
tokens on two threads took 33.3-34.5 ms with it against 37.7-37.8 without (four processes, alternating), the model
read 4K tokens at 113-127 tok/s against 111, and a prefill chunk's attention ran at 210 GFLOPS instead of 310 while a
torch copy ran between the kernel's calls. One thread has no OpenMP workers: nothing changes there. A value the user
set is kept.
"""

from __future__ import annotations

import os

NAME, SETTING = "OMP_WAIT_POLICY", "PASSIVE"


def use_passive_openmp(environ=os.environ) -> bool:
    """Sets ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose a policy; whether it set it. Call it before
    ``import torch`` (OpenMP reads it once, when the library loads)."""
    if environ.get(NAME):
        return False
    environ[NAME] = SETTING
    return True
