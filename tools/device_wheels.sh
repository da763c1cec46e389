#!/usr/bin/env bash
# Download, here, the wheels perf/device_check.sh installs on a lent GPU machine (Python 3.12, x86-64, no
# network), into <repo>/.device_wheels/ (ignored by git; carried with `carry: [".device_wheels"]`).
#
#   tools/device_wheels.sh
#
# Only what the device image lacks (its package list: /work/.library/device/KINDS.md) or has too old:
# hubserve's httptools, orjson, msgspec, hpack, watchfiles and protobuf (engine/proto needs >= 6.33.5), and
# tritonclient with python-rapidjson for the CUDA shared-memory client. Versions are those of the shared venv,
# so the device runs what the tests ran. Not carried: onnxruntime-gpu (a CUDA 12 build of several hundred MB;
# the image's CPU onnxruntime serves the ONNX model) and perf_analyzer (`hubserve perf` measures instead).
# Prints each wheel's size and the total, and fails past BUDGET_MIB: the working tree travels in at most
# 64 MiB, wheels included.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$REPO_ROOT/.device_wheels"
BUDGET_MIB=${BUDGET_MIB:-24}
PY=${PYTHON:-$REPO_ROOT/.venv/bin/python}
PACKAGES=(httptools orjson msgspec hpack watchfiles protobuf tritonclient python-rapidjson)

pins=()
for name in "${PACKAGES[@]}"; do
    version=$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))")
    pins+=("$name==$version")
done
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64 manylinux_2_24_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64; do
    platforms+=(--platform "$p")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$DEST" "${pins[@]}"
total=0
for f in "$DEST"/*.whl; do
    size=$(stat -c %s "$f")
    total=$((total + size))
    printf '%8.2f MiB  %s\n' "$(echo "$size / 1048576" | bc -l)" "$(basename "$f")"
done
printf '%8.2f MiB  total (budget %d MiB)\n' "$(echo "$total / 1048576" | bc -l)" "$BUDGET_MIB"
if (( total > BUDGET_MIB * 1048576 )); then
    echo "device_wheels: the wheels pass the budget" >&2
    exit 1
fi
