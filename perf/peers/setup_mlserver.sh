#!/usr/bin/env bash
# Set up Seldon MLServer (mlserver 1.7.1 from PyPI) as a peer for perf/bench_peers.py.
#
#   bash perf/peers/setup_mlserver.sh
#
# Result, under .peers/ (gitignored):
#   .peers/mlserver/        a venv on the same CPython as hubserve's: mlserver, hubserve's onnxruntime version,
#                           and uvloop<0.22 (see below)
#   .peers/mlserver_repo/   settings.json + <model>/{model.onnx,model-settings.json,spec.json} for simple, mlp,
#                           image (adaptive batching on; written by repos.py)
# The runtime and its launcher are perf/peers/mlserver_runtime.py. Idempotent.
#
# Why uvloop<0.22: mlserver 1.7.1 accepts any uvloop, and pip picks the newest (0.23), whose
# asyncio.get_event_loop() raises "There is no current event loop" when none is set. MLServer's inference
# worker calls it first thing (mlserver/parallel/worker.py, _ignore_signals), so every worker dies at start and
# no model loads ("Couldn't load model ... Model will be removed from registry"). uvloop 0.21 behaves as
# MLServer expects.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/peer_venv.sh"

MLSERVER_VERSION=1.7.1
MODELS="${MODELS:-simple,mlp,image}"

require_hubserve
peer_venv mlserver "$(hubserve_base_python)" "mlserver==$MLSERVER_VERSION" "onnxruntime==$(hubserve_ort_version)" \
    "uvloop<0.22"
"$PEERS_DIR/mlserver/bin/python" -c 'import mlserver, onnxruntime' || die "the mlserver venv cannot import mlserver"
build_models
"$HUBSERVE_PY" "$REPO_ROOT/perf/peers/repos.py" mlserver --models "$MODELS"
log "ready: $PEERS_DIR/mlserver/bin/python perf/peers/mlserver_runtime.py --repository $PEERS_DIR/mlserver_repo ..."
