#!/usr/bin/env bash
# The prepared scaling run (issue 32): perf/bench_scaling.py on a lent 16-core machine, or `--dry-run` anywhere.
#
#   perf/scaling_check.sh [--dry-run] [--out FILE.json] [bench_scaling.py's flags]
#
# On the device (no network): the wheels tools/device_wheels.sh put in .device_wheels/ are installed into
# /tmp/hubserve_site first (what the image lacks), as perf/device_check.sh does; perf_analyzer comes carried
# in .tools/ (tools/scaling_carry.sh puts libb64.so.0d beside its libcudart.so.12 in .tools/lib). The checkout
# is used in place (PYTHONPATH), not installed. A dry run installs nothing and runs on the interpreter's own
# packages (CI's venv); so does a full run with SCALING_WHEELS=0 (here, where .device_wheels/ holds the
# device's cp312 wheels). Everything ends within SCALING_CHECK_LIMIT_S (470 s: under the 8 minutes the issue
# allows; bench_scaling.py skips points that would end past SCALING_LIMIT_S, 450 s). Exit status: 0 when
# every point was measured. PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SITE=/tmp/hubserve_site
DRY_RUN=0
for arg in "$@"; do if [[ "$arg" == "--dry-run" ]]; then DRY_RUN=1; fi; done
if (( ! DRY_RUN )) && [[ "${SCALING_WHEELS:-1}" != 0 ]] && compgen -G ".device_wheels/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .device_wheels/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:$PWD/perf${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SCALING_LIMIT_S=${SCALING_LIMIT_S:-450}
exec timeout "${SCALING_CHECK_LIMIT_S:-470}" "$PY" perf/bench_scaling.py "$@"
