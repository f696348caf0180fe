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
  bitsandbytes==0.50.2                      # --weights 4bit/8bit, the 27B hybrid's nf4, the MoE experts' nf4
)
rm -rf wheels && mkdir -p wheels  # one version of each, never an old one beside a new one
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d wheels "${PACKAGES[@]}"
# bitsandbytes' wheel holds a library per CUDA and ROCm version (~60 MiB): kept, the CPU's and CUDA 13's (the lent
# image runs CUDA 13), so that the wheels stay far inside the 64 MiB a device call carries.
python3 - <<'PY'
import glob, zipfile
for path in glob.glob("wheels/bitsandbytes-*.whl"):
    kept = lambda name: not name.endswith(".so") or name.endswith(("_cpu.so", "_cuda130.so", "_cuda132.so"))
    with zipfile.ZipFile(path) as wheel:
        items = [(info, wheel.read(info)) for info in wheel.infolist() if kept(info.filename)]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for info, data in items:
            if info.filename.endswith(".dist-info/RECORD"):  # the dropped libraries' lines out
                data = b"".join(line for line in data.splitlines(True) if kept(line.split(b",")[0].decode()))
            wheel.writestr(info, data)
PY
ls -la wheels
du -sh wheels
