#!/usr/bin/env bash
# Fills wheels/ with what benchmarks/gpu_session.sh may need on a bare GPU machine (Python 3.12, x86-64, no
# internet there; its image has torch and transformers, and usually the test tools). Run here, where pip
# reaches PyPI; then name wheels in the device call's carry list. wheels/ is git-ignored (a few MiB).
#
#   bash benchmarks/fetch_gpu_wheels.sh        # once; again after changing a version below
#
# The first H200 run lacked gguf and isal (both in requirements.txt); the rest are there in case an image
# lacks them. gpu_session.sh installs only those whose import fails there. One version of each: pip refuses
# two. --no-deps: every dependency it might need is listed itself.
set -eu -o pipefail
cd "$(dirname "$0")/.."
PACKAGES=(
  gguf==0.19.0 pyyaml==6.0.3 tqdm==4.67.1   # GGUF weights (engine/gguf.py); its own needs but numpy
  isal==1.9.1                               # CRC-32 of KV snapshots (zlib's is the fallback)
  psutil==7.2.2 nvidia-ml-py==13.580.82     # host memory, NVML peaks by PCI bus id
  safetensors==0.8.0                        # the converted-weights cache (engine/models/weights_cache.py)
  pytest==9.0.2 pluggy==1.6.0 iniconfig==2.3.0 packaging==25.0
  pytest-xdist==3.8.0 execnet==2.1.2 pytest-timeout==2.4.0
)
rm -rf wheels && mkdir -p wheels  # one version of each, never an old one beside a new one
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d wheels "${PACKAGES[@]}"
ls -la wheels
du -sh wheels
