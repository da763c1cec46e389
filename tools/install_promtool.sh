#!/usr/bin/env bash
# Install Prometheus' own `promtool` into <repo>/.tools/bin, for tests/functional/deploy/ (the autoscaling
# queries evaluated by `promtool test rules` on series shaped like a real scrape).
#
#   tools/install_promtool.sh        (make install-test runs it)
#
# Where from: Debian 12's `prometheus` package, pinned by version and sha256. The .deb is fetched with
# `apt-get download` (no install: nothing of Prometheus' server, users or services lands on the machine) and
# only usr/bin/promtool is extracted from it. Idempotent: when the stamp and the binary agree it only checks
# that promtool runs.
set -euo pipefail

VERSION=2.42.0+ds-5+deb12u1
SHA256=81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN_DIR="$REPO_ROOT/.tools/bin"
PROMTOOL="$BIN_DIR/promtool"
STAMP="$REPO_ROOT/.tools/.promtool.stamp"
STAMP_CONTENT="prometheus=$VERSION sha256:$SHA256"

log() { echo "install_promtool: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" && -x "$PROMTOOL" ]] \
        && "$PROMTOOL" --version >/dev/null 2>&1; then
    echo "promtool $VERSION already installed at $PROMTOOL"
    exit 0
fi
[[ "$(uname -s)/$(uname -m)" == "Linux/x86_64" ]] || die "pinned for Linux x86_64 (this is $(uname -s)/$(uname -m))"
command -v apt-get >/dev/null 2>&1 || die "apt-get is needed to download Debian's prometheus package"

mkdir -p "$BIN_DIR"
WORK="$(mktemp -d "$REPO_ROOT/.tools/.tmp.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"  # apt-get download runs as _apt where it can

if [[ "$(id -u)" -eq 0 ]]; then as_root=(); else as_root=(sudo); fi
if ! (cd "$WORK" && apt-get download -qq "prometheus=$VERSION" 2>/dev/null); then
    log "prometheus=$VERSION not in the package lists; running apt-get update once"
    "${as_root[@]}" apt-get update -qq
    (cd "$WORK" && apt-get download -qq "prometheus=$VERSION") || die "apt-get download prometheus=$VERSION failed"
fi
DEB="$(ls "$WORK"/prometheus_*.deb)"
echo "$SHA256  $DEB" | sha256sum --check --quiet || die "sha256 of $DEB is not $SHA256"
dpkg-deb --fsys-tarfile "$DEB" | tar -x -C "$WORK" ./usr/bin/promtool
mv "$WORK/usr/bin/promtool" "$PROMTOOL.new" && mv "$PROMTOOL.new" "$PROMTOOL"
"$PROMTOOL" --version >/dev/null || die "$PROMTOOL does not run"
echo "$STAMP_CONTENT" >"$STAMP"
echo "promtool $VERSION installed at $PROMTOOL"
