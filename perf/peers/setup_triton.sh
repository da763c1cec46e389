#!/usr/bin/env bash
# Set up NVIDIA Triton Inference Server 2.51 (CPU build) as a peer for perf/bench_peers.py.
#
#   bash perf/peers/setup_triton.sh
#
# Where Triton comes from: the PyPI wheel nvidia-pytriton==0.7.0 ships `tritonserver` 2.51 with its Python
# backend under pytriton/tritonserver/ (and the shared libraries it needs, libcudart included, in
# nvidia_pytriton.libs/; no GPU is needed). It has no ONNX Runtime backend, so each model is served by a small
# Python-backend model (perf/peers/triton_model.py) that runs the same model.onnx with onnxruntime on the
# batches Triton's dynamic batcher forms.
#
# What it needs, found with ldd on bin/tritonserver, backends/python/libtriton_python.so and
# python_backend_stubs/3.11/triton_python_backend_stub:
#   - everything but libpython resolves from the wheel itself (RPATH $ORIGIN/../../../../nvidia_pytriton.libs);
#   - the Python backend stub for 3.11 links Debian's libpython3.11.so.1.0 (apt: libpython3.11) and must sit
#     in the backend folder (backends/python/), where the RPATH above resolves the same way;
#   - the stub runs its embedded interpreter isolated (sys.flags.isolated=1: PYTHONPATH and venv activation are
#     ignored, sys.prefix is /usr), so the packages come from a venv made with Debian's /usr/bin/python3.11
#     (apt: python3.11-venv), whose site-packages path the generated model.py puts on sys.path itself;
#   - the stub's C++ side is built against numpy 1.x: the venv gets numpy<2, and the onnxruntime that hubserve
#     runs (its cp311 wheel works with numpy 1.26).
# No environment variables are needed (no LD_LIBRARY_PATH, no PYTHONPATH).
#
# Result, all under .peers/ (gitignored):
#   .peers/triton/                 the venv (Debian python3.11, numpy<2, onnxruntime, nvidia-pytriton --no-deps)
#   .peers/triton/bin/tritonserver a link to the binary inside the wheel
#   .peers/triton/backends         Triton's --backend-directory (the wheel's, with the 3.11 stub in place)
#   .peers/triton_repo/<model>/    config.pbtxt + 1/{model.py,model.onnx,site-packages.txt} for simple, mlp, image
# Idempotent: a second run only re-checks and regenerates the repository.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/peer_venv.sh"

PYTRITON_VERSION=0.7.0
DEBIAN_PYTHON=/usr/bin/python3.11
MODELS="${MODELS:-simple,mlp,image}"

require_hubserve
[[ "$(uname -s)/$(uname -m)" == "Linux/x86_64" ]] || die "the tritonserver in nvidia-pytriton is Linux x86_64 only"

# 1. Debian packages: the stub's libpython3.11, and venv support for Debian's python3.11.
missing=()
for pkg in libpython3.11 python3.11-venv; do
    status="$(dpkg -s "$pkg" 2>/dev/null || true)"  # captured, not piped into grep -q (SIGPIPE + pipefail)
    [[ "$status" == *$'\nStatus: install ok installed'* ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
    [[ "$(id -u)" == 0 ]] || die "missing Debian packages ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
    log "apt-get install ${missing[*]}"
    timeout 600 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[[ -x "$DEBIAN_PYTHON" ]] || die "$DEBIAN_PYTHON is missing (Debian's python3.11)"

# 2. The venv: numpy 1.x and hubserve's onnxruntime version, then the wheel without its Python API's deps
#    (tritonclient, pyzmq, typer, ...: we only use the server binary and the Python backend inside it).
ORT_VERSION="$(hubserve_ort_version)"
peer_venv triton "$DEBIAN_PYTHON" "numpy<2" "onnxruntime==$ORT_VERSION"
VENV="$PEERS_DIR/triton"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
TS="$SITE/pytriton/tritonserver"
if [[ ! -x "$TS/bin/tritonserver" ]] || [[ "$("$VENV/bin/python" -m pip show nvidia-pytriton 2>/dev/null \
        | sed -n 's/^Version: //p')" != "$PYTRITON_VERSION" ]]; then
    log "pip install --no-deps nvidia-pytriton==$PYTRITON_VERSION (55 MB)"
    timeout "$PIP_TIMEOUT_S" "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
        "nvidia-pytriton==$PYTRITON_VERSION" || die "pip install nvidia-pytriton failed"
fi

# 3. The 3.11 stub goes where the Python backend looks for it; a stable path for the binary and backends.
cp -f "$TS/python_backend_stubs/3.11/triton_python_backend_stub" "$TS/backends/python/"
ln -sfn "$TS/bin/tritonserver" "$VENV/bin/tritonserver"
ln -sfn "$TS/backends" "$VENV/backends"

# 4. Check that every shared library resolves, and that the stub's interpreter can import what model.py needs.
for lib in "$TS/bin/tritonserver" "$TS/backends/python/libtriton_python.so" \
           "$TS/backends/python/triton_python_backend_stub"; do
    unresolved="$(ldd "$lib" | grep 'not found' || true)"
    [[ -z "$unresolved" ]] || die "$lib: unresolved libraries:"$'\n'"$unresolved"
done
"$VENV/bin/python" -c 'import numpy, onnxruntime; assert numpy.__version__.startswith("1."), numpy.__version__' \
    || die "the triton venv cannot import numpy 1.x and onnxruntime"

# 5. The model repository, generated from hubserve's configs.
build_models
"$HUBSERVE_PY" "$REPO_ROOT/perf/peers/repos.py" triton --models "$MODELS" --site-packages "$SITE"
log "ready: $VENV/bin/tritonserver --model-repository $PEERS_DIR/triton_repo --backend-directory $VENV/backends"
