#!/usr/bin/env bash
# Make, here, what perf/scaling_check.sh needs on a lent 16-core machine (no network) and check that it travels:
# the wheels the image lacks (tools/device_wheels.sh, into .device_wheels/) and perf_analyzer with every
# library its binary needs that the device image may not have, in .tools/lib beside libcudart.so.12 (which
# tools/install_perf_analyzer.sh put there): libb64.so.0d, Debian's, the one the binary is linked against here.
#
#   tools/scaling_carry.sh
#
# Then the run's carry list: .device_wheels .tools/bin/perf_analyzer .tools/bin/perf_analyzer.bin .tools/lib
# (not .tools/ whole: promtool is 48 MB of it). Prints the size of each and of the working tree that travels
# with them, and fails past the 64 MiB the device takes (/work/.library/device/README.md "Limits").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LIMIT_MIB=64
CARRY=(.device_wheels .tools/bin/perf_analyzer .tools/bin/perf_analyzer.bin .tools/lib)
[[ -x .tools/bin/perf_analyzer.bin ]] || PYTHON=${PYTHON:-.venv/bin/python} bash tools/install_perf_analyzer.sh
compgen -G ".device_wheels/*.whl" >/dev/null || bash tools/device_wheels.sh
b64=$(LD_LIBRARY_PATH=.tools/lib ldd .tools/bin/perf_analyzer.bin | awk '$1 == "libb64.so.0d" {print $3}')
[[ -n "$b64" && -f "$b64" ]] || { echo "scaling_carry: libb64.so.0d not found (apt-get install libb64-0d)" >&2; exit 1; }
if [[ "$(readlink -f "$b64")" != "$(readlink -f .tools/lib/libb64.so.0d 2>/dev/null)" ]]; then
    cp -L "$b64" .tools/lib/libb64.so.0d
fi
missing=$(LD_LIBRARY_PATH=.tools/lib ldd .tools/bin/perf_analyzer.bin | grep "not found" || true)
[[ -z "$missing" ]] || { echo "scaling_carry: still missing: $missing" >&2; exit 1; }
total=0
for path in "${CARRY[@]}"; do
    size=$(du -sb "$path" | cut -f1)
    total=$((total + size))
    printf '%8.2f MiB  %s\n' "$(echo "$size / 1048576" | bc -l)" "$path"
done
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
total=$((total + tree))
printf '%8.2f MiB  the working tree (tracked and untracked files git does not ignore)\n' \
    "$(echo "$tree / 1048576" | bc -l)"
printf '%8.2f MiB  in all (limit %d MiB)\n' "$(echo "$total / 1048576" | bc -l)" "$LIMIT_MIB"
if (( total > LIMIT_MIB * 1048576 )); then
    echo "scaling_carry: more than the device takes" >&2
    exit 1
fi
