# Sourced by perf/peers/setup_*.sh: make one peer's virtualenv under .peers/ and pip-install pinned packages
# from PyPI into it. Idempotent: a stamp file records the python and the package list; when it matches, nothing
# is downloaded again.
#
#   source perf/peers/peer_venv.sh
#   peer_venv NAME PYTHON PACKAGE...     # -> .peers/NAME, its python at .peers/NAME/bin/python

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS_DIR="$REPO_ROOT/.peers"
HUBSERVE_PY="$REPO_ROOT/.venv/bin/python"
PIP_TIMEOUT_S="${PIP_TIMEOUT_S:-1200}"

log() { echo "$(basename "$0"): $*" >&2; }
die() { log "error: $*"; exit 1; }

# hubserve's venv must exist: it builds the ONNX models and generates the peer repositories from its configs.
require_hubserve() {
    [[ -x "$HUBSERVE_PY" ]] || die "$HUBSERVE_PY is missing: run 'make install' first"
}

# The CPython that hubserve's venv was made from, so a peer runs on the same interpreter build.
hubserve_base_python() {
    "$HUBSERVE_PY" -c 'import sys; print(sys._base_executable)'
}

# The onnxruntime version hubserve runs (its venv may hold onnxruntime or onnxruntime-gpu); peers get the
# CPU wheel of the same version.
hubserve_ort_version() {
    "$HUBSERVE_PY" -c 'import onnxruntime; print(onnxruntime.__version__.split("+")[0])'
}

peer_venv() {
    local name="$1" python="$2"
    shift 2
    local venv="$PEERS_DIR/$name" stamp="$PEERS_DIR/$name/.installed"
    local want="python=$("$python" -c 'import sys; print(sys.version.split()[0], sys.executable)') packages=$*"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/python" ]]; then
        log "$venv is up to date ($*)"
        return 0
    fi
    log "creating $venv with $python"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    log "pip install $* (PyPI; bounded by ${PIP_TIMEOUT_S}s)"
    timeout "$PIP_TIMEOUT_S" "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" \
        || die "pip install into $venv failed"
    echo "$want" > "$stamp"
}

# A generated peer repository is only as fresh as the models hubserve serves: build them first.
build_models() {
    "$HUBSERVE_PY" -m hubserve_models.examples "$REPO_ROOT/model_repository" >/dev/null
}
