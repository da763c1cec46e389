#!/usr/bin/env bash
# The prepared device run (issue 33): perf/device_check.py on a lent GPU machine, or `--dry-run` anywhere.
#
#   perf/device_check.sh [--dry-run] [--out FILE] [--window-s S]
#
# On the device (no network): the wheels tools/device_wheels.sh put in .device_wheels/ (carried with the
# working tree: `carry: [".device_wheels"]`) are installed into /tmp/hubserve_site first, for what the image
# lacks (httptools, orjson, msgspec, hpack, watchfiles, a recent protobuf, tritonclient); the checkout itself
# is used in place (PYTHONPATH), not installed. A dry run installs nothing: it runs on the interpreter's own
# packages (CI's venv). Everything ends within DEVICE_CHECK_LIMIT_S (470 s: under the 8 minutes the
# issue allows). Exit status: 0 when no check failed. PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SITE=/tmp/hubserve_site
DRY_RUN=0
for arg in "$@"; do if [[ "$arg" == "--dry-run" ]]; then DRY_RUN=1; fi; done
if (( ! DRY_RUN )) && compgen -G ".device_wheels/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .device_wheels/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:$PWD/perf${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec timeout "${DEVICE_CHECK_LIMIT_S:-470}" "$PY" perf/device_check.py "$@"
