#!/usr/bin/env bash
# Set up the KServe python model server (kserve 0.21.0 from PyPI) as a peer for perf/bench_peers.py.
#
#   bash perf/peers/setup_kserve.sh
#
# Result, under .peers/ (gitignored):
#   .peers/kserve/          a venv on the same CPython as hubserve's, with kserve and hubserve's onnxruntime version
#   .peers/kserve_repo/     <model>/{model.onnx,spec.json} for simple, mlp, image (spec.json: written by repos.py)
# The server itself is perf/peers/kserve_model.py (a kserve.Model running ONNX Runtime). Idempotent.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/peer_venv.sh"

KSERVE_VERSION=0.21.0
MODELS="${MODELS:-simple,mlp,image}"

require_hubserve
peer_venv kserve "$(hubserve_base_python)" "kserve==$KSERVE_VERSION" "onnxruntime==$(hubserve_ort_version)"
"$PEERS_DIR/kserve/bin/python" -c 'import kserve, onnxruntime' || die "the kserve venv cannot import kserve"
build_models
"$HUBSERVE_PY" "$REPO_ROOT/perf/peers/repos.py" kserve --models "$MODELS"
log "ready: $PEERS_DIR/kserve/bin/python perf/peers/kserve_model.py --repository $PEERS_DIR/kserve_repo --models $MODELS"
