#!/usr/bin/env bash
# Regenerates the CI baseline of this machine's CPU kernel path, results/baseline/ci/<path>/
# (`attnbench list --kernel-path`), from configs/ci.toml with the release build of the
# checked-out commit. Use it when a change is meant to move the numbers (or
# changes the cases), on a quiet machine, then commit the result on its own: a baseline
# change is a reviewed commit of its own (README, "Comparing runs").
set -euo pipefail
cd "$(dirname "$0")/.."

if ! git diff --quiet HEAD -- src Cargo.toml Cargo.lock configs/ci.toml 2>/dev/null; then
    echo "warning: uncommitted changes to the sources or configs/ci.toml; the baseline's" \
         "meta.json will record git_dirty = true" >&2
fi
if [[ -r /proc/loadavg ]]; then
    read -r load _ < /proc/loadavg
    echo "load average before the sweep: $load (a quiet machine gives a baseline that gates tightly)" >&2
fi

cargo build --release
path="$(./target/release/attnbench list --kernel-path)"
out="results/baseline/ci/$path"
new="results/baseline/ci/$path.new"
others="$(ls -d results/baseline/ci/*/ 2> /dev/null | grep -v "/$path/$" || true)"
if [ -n "$others" ]; then
    echo "note: only $out is regenerated; when the change moves memory or the cases, also" \
         "run this on a machine of each other path:" $others >&2
fi
rm -rf "$new"
log="$(mktemp)"
trap 'rm -rf "$new" "$log"' EXIT
if ! ./target/release/attnbench sweep --config configs/ci.toml --out "$new" > "$log" 2>&1; then
    cat "$log"
    exit 1
fi
# Replace the old baseline only once the new one is complete.
rm -rf "$out"
mv "$new" "$out"
# The new baseline passes against itself, or it is not a baseline.
./target/release/attnbench compare "$out" "$out" > /dev/null
echo "wrote $out ($(($(wc -l < "$out/runs.csv") - 1)) cases). Review, then commit it alone:"
echo "  git add $out && git commit -m 'CI baseline: <why the numbers move>'"
