#!/usr/bin/env bash
# Installs Horovod 0.28.1 (PyTorch + Gloo, no MPI) into .venv for stragglerkit's Horovod
# integration and its tests. Horovod 0.28.1 as released asks CMake for C++14, which torch's
# headers no longer accept; upstream raised it to C++17 after the release, and this script makes
# the same change to the published source. The wheel is built once and cached outside the
# repository ($STRAGGLERKIT_CACHE, default ~/.cache/stragglerkit), keyed by the torch version it
# was built against; about 4 minutes on 2 cores the first time, seconds afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.28.1
PY=.venv/bin/python
CACHE=${STRAGGLERKIT_CACHE:-$HOME/.cache/stragglerkit}
TORCH=$($PY -c 'import torch; print(torch.__version__.split("+")[0])')
WHEELS="$CACHE/horovod-$VERSION-torch-$TORCH"
PIP=($PY -m pip --disable-pip-version-check -q)
if $PY -c "import horovod.torch, sys; import horovod; sys.exit(horovod.__version__ != '$VERSION')" 2>/dev/null; then
  exit 0
fi
"${PIP[@]}" install cmake cloudpickle psutil packaging mock
if ! ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1; then
  echo "[horovod] building Horovod $VERSION against torch $TORCH (once; cached in $WHEELS)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "${PIP[@]}" download --no-deps --no-binary :all: "horovod==$VERSION" -d "$work"
  tar xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
  src="$work/horovod-$VERSION"
  # the one change made upstream after the release: C++17 for torch's headers
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  mkdir -p "$WHEELS"
  PATH="$(dirname "$PY"):$PATH" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    "${PIP[@]}" wheel --no-deps --no-build-isolation -w "$WHEELS" "$src" >"$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log"; echo "[horovod] the build failed (log above)"; exit 1; }
fi
"${PIP[@]}" install --no-deps "$WHEELS"/horovod-*.whl
$PY -c 'import horovod, horovod.torch; print("[horovod] ready:", horovod.__version__)'
