#!/usr/bin/env bash
# Build Triton's own C++ onnxruntime backend (triton-inference-server/onnxruntime_backend, branch r24.10: the
# branch of server 2.51, backend API 1.19), CPU only, for the tritonserver that setup_triton.sh installs, so
# perf/bench_peers.py can run Triton as Triton users run ONNX models (server name `triton-ort`) instead of
# through the Python-backend stand-in (server name `triton`).
#
#   SOURCES=<folder> bash perf/peers/setup_triton_ort.sh
#
# SOURCES holds the four Triton repositories and yalue/onnxruntime_go at the commits pinned below, in either
# form (this script never goes to GitHub itself; a machine that cannot reach GitHub gets the folder copied):
#   - git directories named <owner>+<name>/repo, the layout of the search tool's `fetch`
#     (e.g. SOURCES=/work/.mirror), or `git clone --bare` results renamed so;
#   - tarballs named <name>-<commit>.tar.gz, which is what GitHub's
#     https://github.com/<owner>/<name>/archive/<commit>.tar.gz downloads as.
# Once extracted (.peers/triton_ort/src/, stamped with the commit), SOURCES is not needed again.
#
# Why onnxruntime_go: the r24.10 backend is written against ONNX Runtime 1.19's C API, and that repository
# vendors 1.19.0's onnxruntime_c_api.h verbatim (checked by sha256 below). The backend is linked against the
# libonnxruntime.so.<version> of the onnxruntime CPU wheel that setup_triton.sh put in .peers/triton (the
# version hubserve runs), so every server runs the same ONNX Runtime build; a newer library serves API 19.
#
# Two things the wheel's Triton needs that a stock build does not do:
#   - auditwheel renamed libtritonserver.so to nvidia_pytriton.libs/libtritonserver-<hash>.so, so the built
#     backend's NEEDED entry is rewritten to that name (patchelf); tritonserver has it loaded already;
#   - CMake would FetchContent the repositories from GitHub: every FETCHCONTENT_SOURCE_DIR_* points at the
#     extracted sources instead (googletest at Debian's, only because common's CMakeLists adds its tests).
#
# Debian packages (apt-get when missing, as root): cmake g++ make rapidjson-dev googletest patchelf.
# Builds at nice 19 with make -j1 (a few minutes on 2 cores), only the backend target.
#
# Result, under .peers/ (gitignored):
#   .peers/triton_ort/bin/tritonserver            a link to the wheel's binary (setup_triton.sh)
#   .peers/triton_ort/backends/onnxruntime/       libtriton_onnxruntime.so, libonnxruntime.so.*, BUILD_INFO
#   .peers/triton_ort_repo/<model>/               config.pbtxt (backend "onnxruntime") + 1/model.onnx
# Idempotent: a second run re-checks, rebuilds incrementally and regenerates the repository.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/peer_venv.sh"

MODELS="${MODELS:-simple,mlp,image}"
OUT="$PEERS_DIR/triton_ort"
# r24.10 = Triton 2.51.0 (TRITONBACKEND API 1.19, TRITONSERVER API 1.34)
declare -A COMMIT=(
    [onnxruntime_backend]=17e5cb23a6fbeb37282eb7079dd0b580cd79530d
    [backend]=ac03a5d97403dec841ad46d0439e93db12c9268f
    [core]=bfec7c61dc0939433f64f14e89b1973073eac8ba
    [common]=578491fc3944f77d16a6a38e3d7691c485c47ba0
)
ORT_GO_COMMIT=9abc5adfda6e17b667e83331c32254fa55808113   # "Upgrade to onnxruntime 1.19.0"
ORT_HEADER_SHA256=bfdb387ef6f576ccbeb18c63e19fe5854aa0c278a3838027e9f764419e61475e

require_hubserve
SITE="$PEERS_DIR/triton/lib/python3.11/site-packages"
TS="$SITE/pytriton/tritonserver"
[[ -x "$TS/bin/tritonserver" ]] || die "no tritonserver in $TS: run \`bash perf/peers/setup_triton.sh\` first"

# 1. Debian build dependencies.
missing=()
for pkg in cmake g++ make rapidjson-dev googletest patchelf; do
    status="$(dpkg -s "$pkg" 2>/dev/null || true)"
    [[ "$status" == *$'\nStatus: install ok installed'* ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
    [[ "$(id -u)" == 0 ]] || die "missing Debian packages ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
    log "apt-get install ${missing[*]}"
    timeout 600 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. Sources, extracted once per pinned commit.
# extract OWNER NAME COMMIT DEST [PATH]: from SOURCES' git directory or tarball into DEST (stamped DEST/.commit);
# PATH: only that file (onnxruntime_go's other files include binaries a mirror may not hold).
extract() {
    local owner="$1" name="$2" commit="$3" dest="$4" only="${5:-}"
    [[ -f "$dest/.commit" && "$(cat "$dest/.commit")" == "$commit" ]] && return 0
    local git_dir="${SOURCES:-}/$owner+$name/repo" tarball="${SOURCES:-}/$name-$commit.tar.gz"
    [[ -n "${SOURCES:-}" ]] || die "$dest is not extracted yet: set SOURCES (see the top of this script)"
    rm -rf "$dest"
    mkdir -p "$dest"
    if [[ -d "$git_dir" ]]; then
        git --git-dir "$git_dir" cat-file -e "$commit^{commit}" 2>/dev/null \
            || die "$git_dir lacks commit $commit of $owner/$name"
        if [[ -n "$only" ]]; then
            git --git-dir "$git_dir" show "$commit:$only" > "$dest/$only"
        else
            git --git-dir "$git_dir" archive "$commit" | tar -x -C "$dest"
        fi
    elif [[ -f "$tarball" ]]; then
        tar -xzf "$tarball" -C "$dest" --strip-components=1 ${only:+--wildcards "*/$only"}
    else
        die "neither $git_dir nor $tarball: fetch github:$owner/$name, or download
    https://github.com/$owner/$name/archive/$commit.tar.gz into SOURCES"
    fi
    echo "$commit" > "$dest/.commit"
    rm -rf "$OUT/build"  # archives carry commit times as mtimes: make would not see a change
    log "extracted $owner/$name @ ${commit:0:12}"
}
for name in onnxruntime_backend backend core common; do
    extract triton-inference-server "$name" "${COMMIT[$name]}" "$OUT/src/$name"
done
extract yalue onnxruntime_go "$ORT_GO_COMMIT" "$OUT/src/onnxruntime_go" onnxruntime_c_api.h
header="$OUT/src/onnxruntime_go/onnxruntime_c_api.h"
echo "$ORT_HEADER_SHA256  $header" | sha256sum -c --status || die "$header: sha256 is not ORT 1.19.0's"

# 3. ONNX Runtime: the header above, the library from the triton venv's onnxruntime wheel.
ORT_VERSION="$(hubserve_ort_version)"
ort_lib="$SITE/onnxruntime/capi/libonnxruntime.so.$ORT_VERSION"
[[ -f "$ort_lib" ]] || die "$ort_lib is missing (setup_triton.sh installs onnxruntime==$ORT_VERSION in .peers/triton)"
mkdir -p "$OUT/ort/include" "$OUT/ort/lib"
cmp -s "$header" "$OUT/ort/include/onnxruntime_c_api.h" || cp -f "$header" "$OUT/ort/include/"
cmp -s "$ort_lib" "$OUT/ort/lib/libonnxruntime.so.$ORT_VERSION" || cp -f "$ort_lib" "$OUT/ort/lib/"
ln -sfn "libonnxruntime.so.$ORT_VERSION" "$OUT/ort/lib/libonnxruntime.so.1"
ln -sfn libonnxruntime.so.1 "$OUT/ort/lib/libonnxruntime.so"

# 4. Configure and build the backend alone, nothing downloaded.
S="$OUT/src"
log "cmake configure (log: $OUT/cmake.log)"
nice -n 19 cmake -S "$S/onnxruntime_backend" -B "$OUT/build" -Wno-dev \
    -DCMAKE_BUILD_TYPE=Release \
    -DTRITON_ENABLE_GPU=OFF -DTRITON_ENABLE_ONNXRUNTIME_TENSORRT=OFF -DTRITON_ENABLE_ONNXRUNTIME_OPENVINO=OFF \
    -DTRITON_ONNXRUNTIME_INCLUDE_PATHS="$OUT/ort/include" -DTRITON_ONNXRUNTIME_LIB_PATHS="$OUT/ort/lib" \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_REPO-COMMON="$S/common" \
    -DFETCHCONTENT_SOURCE_DIR_REPO-CORE="$S/core" \
    -DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND="$S/backend" \
    -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=/usr/src/googletest \
    > "$OUT/cmake.log" 2>&1 || { tail -n 30 "$OUT/cmake.log" >&2; die "cmake configure failed"; }
log "make -j1 triton-onnxruntime-backend at nice 19 (log: $OUT/make.log)"
nice -n 19 make -C "$OUT/build" -j1 triton-onnxruntime-backend > "$OUT/make.log" 2>&1 \
    || { tail -n 40 "$OUT/make.log" >&2; die "the build failed"; }

# 5. The backend directory Triton is pointed at; files replaced by rename, never rewritten in place.
B="$OUT/backends/onnxruntime"
mkdir -p "$B" "$OUT/bin"
server_lib="$(cd "$SITE/nvidia_pytriton.libs" && ls libtritonserver-*.so | head -1)"
[[ -n "$server_lib" ]] || die "no libtritonserver-*.so in $SITE/nvidia_pytriton.libs"
cp "$OUT/build/libtriton_onnxruntime.so" "$B/.new.so"
patchelf --replace-needed libtritonserver.so "$server_lib" "$B/.new.so"
mv -f "$B/.new.so" "$B/libtriton_onnxruntime.so"
cmp -s "$ort_lib" "$B/libonnxruntime.so.$ORT_VERSION" \
    || { cp "$ort_lib" "$B/.new.ort"; mv -f "$B/.new.ort" "$B/libonnxruntime.so.$ORT_VERSION"; }
ln -sfn "libonnxruntime.so.$ORT_VERSION" "$B/libonnxruntime.so.1"
for f in "$B"/libonnxruntime.so.*.*; do  # another version left by an earlier run
    [[ "$f" == "$B/libonnxruntime.so.$ORT_VERSION" ]] || rm -f "$f"
done
ln -sfn "$TS/bin/tritonserver" "$OUT/bin/tritonserver"
unresolved="$(cd "$B" && LD_LIBRARY_PATH="$SITE/nvidia_pytriton.libs" ldd ./libtriton_onnxruntime.so | grep 'not found' || true)"
[[ -z "$unresolved" ]] || die "libtriton_onnxruntime.so: unresolved libraries:"$'\n'"$unresolved"
cat > "$B/BUILD_INFO" <<EOF
libtriton_onnxruntime.so: triton-inference-server/onnxruntime_backend r24.10 ${COMMIT[onnxruntime_backend]}
  backend ${COMMIT[backend]} core ${COMMIT[core]} common ${COMMIT[common]}
  CPU only (TRITON_ENABLE_GPU=OFF, no TensorRT/OpenVINO), Release, $(c++ --version | head -1)
  NEEDED libtritonserver.so rewritten to $server_lib
  onnxruntime_c_api.h: ORT 1.19.0 (API 19) from yalue/onnxruntime_go $ORT_GO_COMMIT
libonnxruntime.so.$ORT_VERSION: the onnxruntime==$ORT_VERSION CPU wheel in .peers/triton
tritonserver: nvidia-pytriton 0.7.0 (Triton 2.51.0), $TS/bin/tritonserver
EOF

# 6. The model repository, and a smoke check: Triton loads `simple` with this backend and adds.
build_models
"$HUBSERVE_PY" "$REPO_ROOT/perf/peers/repos.py" triton-ort --models "$MODELS"
smoke="$OUT/smoke"
rm -rf "$smoke" && mkdir -p "$smoke/repo" && cp -a "$PEERS_DIR/triton_ort_repo/simple" "$smoke/repo/"
read -r http grpc metrics < <("$HUBSERVE_PY" -c 'from hubserve_harness import free_ports; print(*free_ports(3))')
"$OUT/bin/tritonserver" --model-repository "$smoke/repo" --backend-directory "$OUT/backends" \
    --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 \
    --http-port "$http" --grpc-port "$grpc" --metrics-port "$metrics" > "$smoke/server.log" 2>&1 &
pid=$!
reply=""
for _ in $(seq 1 120); do
    kill -0 "$pid" 2>/dev/null || break
    if curl -sf -o /dev/null "http://127.0.0.1:$http/v2/models/simple/ready"; then
        reply="$(curl -s -X POST "http://127.0.0.1:$http/v2/models/simple/infer" -d '{"inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}')"
        break
    fi
    sleep 0.5
done
kill "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
[[ "$reply" == *'"data":[2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]'* ]] && grep -q libtriton_onnxruntime.so "$smoke/server.log" \
    || { tail -n 30 "$smoke/server.log" >&2; die "smoke check failed: simple did not add through the C++ backend (reply: ${reply:0:200})"; }
log "ready: .venv/bin/python perf/bench_peers.py --servers hubserve,triton-ort (backend: $B)"
