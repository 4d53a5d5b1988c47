#!/usr/bin/env bash
# Device check for tbl-resident on a CUDA machine, from a bare checkout of the repository.
#
#   packages/tbl-resident/scripts/gpu_check.sh [gpu_check.py options]     e.g. --dataset-gb 7.7
#
# The pure-Python packages are imported from their source folders (their metadata installed once
# into /tmp/tbl-site when missing: needs hatchling); tbl-kernels (compiled) is
# used if importable, otherwise built once into /tmp/tbl-kernels-site (needs cmake, a C++
# compiler, scikit-build-core and nanobind, no network). Results: $OUT/gpu_check.json when
# OUT is set, else ./gpu_check.json; the log goes to stdout.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$repo"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$repo/packages/tbl-format/src:$repo/packages/tbl-loader/src:$repo/packages/tbl-resident/src:$repo/packages/tbl-bench/src${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c "import importlib.metadata as m; m.version('tbl-loader')" 2>/dev/null; then
  # Package metadata (tbl-loader reads its own kernels pin from it): installed once into
  # /tmp/tbl-site (needs hatchling; no network), behind the source folders on the path.
  echo "installing the pure-Python packages' metadata into /tmp/tbl-site"
  "$py" -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/tbl-site \
    "$repo/packages/tbl-format" "$repo/packages/tbl-loader" "$repo/packages/tbl-resident" "$repo/packages/tbl-bench"
  export PYTHONPATH="$PYTHONPATH:/tmp/tbl-site"
fi
if ! "$py" -c "import tbl_kernels" 2>/dev/null; then
  echo "building tbl-kernels into /tmp/tbl-kernels-site"
  "$py" -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/tbl-kernels-site \
    "$repo/packages/tbl-kernels"
  export PYTHONPATH="/tmp/tbl-kernels-site:$PYTHONPATH"
fi
"$py" -c "import torch, tbl_kernels, tbl_loader, tbl_resident; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'tbl_kernels', tbl_kernels.__version__)"
out="${OUT:-.}/gpu_check.json"
exec "$py" "$repo/packages/tbl-resident/scripts/gpu_check.py" --out "$out" "$@"
