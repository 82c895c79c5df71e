#!/usr/bin/env bash
# Copies the pure-Python packages the GPU check needs beyond torch (megatron-core and packaging)
# from .venv into gpu_deps/ (ignored by git), for a GPU machine that cannot install packages:
# bring gpu_deps/ along with the working tree and scripts/gpu_check.sh puts it on PYTHONPATH.
# megatron-core's one compiled module (the dataset index helpers) is left out; nothing here uses it.
#   bash scripts/setup.sh && bash scripts/gpu_deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf gpu_deps && mkdir -p gpu_deps
for package in megatron packaging; do
  if [ ! -d "$SITE/$package" ]; then
    echo "gpu_deps: $package is not installed in .venv; run bash scripts/setup.sh first" >&2
    exit 1
  fi
  cp -r "$SITE/$package" gpu_deps/
done
find gpu_deps -name '*.so' -delete
find gpu_deps -name '__pycache__' -type d -prune -exec rm -rf {} +
echo "gpu_deps: $(du -sh gpu_deps | cut -f1) in gpu_deps/ (megatron-core $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("megatron-core"))'))"
