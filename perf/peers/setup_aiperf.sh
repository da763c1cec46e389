#!/usr/bin/env bash
# Set up NVIDIA's aiperf (a load generator for OpenAI-compatible servers, nobody here wrote it) for
# perf/bench_external.py, in its own venv: it is never a dependency of hubserve.
#
#   bash perf/peers/setup_aiperf.sh        # -> .peers/aiperf/bin/aiperf
#
# The pinned version is the one the figures in perf/README.md were measured with. Idempotent: a second run
# only checks the stamp (perf/peers/peer_venv.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/peer_venv.sh"

AIPERF_VERSION="${AIPERF_VERSION:-0.13.0}"

require_hubserve
peer_venv aiperf "$(hubserve_base_python)" "aiperf==$AIPERF_VERSION"
"$PEERS_DIR/aiperf/bin/aiperf" --version >/dev/null 2>&1 || "$PEERS_DIR/aiperf/bin/aiperf" --help >/dev/null \
    || die "$PEERS_DIR/aiperf/bin/aiperf does not run"
log "aiperf $AIPERF_VERSION ready: $PEERS_DIR/aiperf/bin/aiperf"
