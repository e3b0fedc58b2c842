#!/bin/sh
# Benchmark setup (not a test, not part of make check): a Python virtual
# environment with the PyTorch that users install today (torch 2.x from PyPI),
# as the second reference column of tests/bench_isa.sh (-p VENV/bin/python).
#
#   tests/bench_torch_venv.sh [-v TORCH_VERSION] [VENV_DIR]
#
# VENV_DIR defaults to /work/venv-torch2, TORCH_VERSION to 2.15.0. Needs
# Debian's venv module (python3 -m venv): apt-get install -y python3-venv
# (not in .ci/packages: CI runs no benchmark). It tries PyTorch's CPU-only
# wheel index first (download.pytorch.org/whl/cpu, about 200 MB) and falls back
# to plain PyPI, whose x86_64 Linux wheels pull the CUDA libraries (several GB
# in VENV_DIR; they stay unused on a CPU-only machine). torchvision comes
# too, the release pip pairs with that torch (tests/golden/resnet_golden.py
# builds its models from torchvision's ResNet).
# At the end it runs tests/golden/bench_nn_torch.py for one step under the new
# interpreter and prints the torch version, its oneDNN version and the CPU
# capability it uses. docs/perf-isa.md section 3.
set -eu
src=${COHORT_SRCDIR:-$(dirname "$0")/..}
version=2.15.0
while getopts v: o; do
  case $o in
    v) version=$OPTARG ;;
    *) echo "usage: $0 [-v TORCH_VERSION] [VENV_DIR]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
venv=${1:-/work/venv-torch2}
sys_py=${SYSTEM_PYTHON3:-/usr/bin/python3}

if [ ! -x "$venv/bin/python" ]; then
  "$sys_py" -m venv "$venv" || {
    echo "$0: '$sys_py -m venv $venv' failed; install Debian's python3-venv (apt-get install -y python3-venv)" >&2
    exit 1
  }
fi
py=$venv/bin/python
# PIP_FIND_LINKS (a local wheel folder) would offer wheels built for other
# Pythons or torch versions: this environment takes its torch from the index.
if PIP_FIND_LINKS="" "$py" -m pip install --no-cache-dir --retries 0 --timeout 20 \
     "torch==$version" torchvision --index-url https://download.pytorch.org/whl/cpu; then
  echo "$0: torch $version from download.pytorch.org/whl/cpu (CPU-only wheel)"
else
  echo "$0: the CPU-only index is not reachable or lacks torch $version; installing from PyPI" >&2
  PIP_FIND_LINKS="" "$py" -m pip install --no-cache-dir "torch==$version" torchvision
fi
"$py" -c 'import torch
show = torch.__config__.show().splitlines()
pick = lambda key: next((l.split(key, 1)[1].strip() for l in show if key in l), "?")
print("torch", torch.__version__, "oneDNN", pick("MKL-DNN"), "CPU capability", pick("CPU capability usage:"))'
"$py" "$src/tests/golden/bench_nn_torch.py" --arch resnet18 --batch 4 --steps 1 --warmup 0
echo "$0: ready: tests/bench_isa.sh -p $py"
