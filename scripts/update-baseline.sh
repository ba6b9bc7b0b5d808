#!/usr/bin/env bash
# Regenerates the CI baseline of this machine, results/baseline/ci/<machine key>/
# (`attnbench list --machine-key`: CPU vendor, family, model and kernel path), from
# configs/ci.toml with the release build of the checked-out commit, and makes that commit
# the baseline build of the A/B time gate (results/baseline/ci/ab-revision). Use it when a
# change is meant to move the numbers (or changes the cases), or on a machine that has no
# baseline yet, then commit the result on its own: a baseline change is a reviewed commit
# of its own (docs/guide/ci-gate.md, "The CI gate and its baseline").
set -euo pipefail
cd "$(dirname "$0")/.."

# The A/B gate rebuilds the baseline from its revision: what is measured must be committed.
if ! git diff --quiet HEAD -- src Cargo.toml Cargo.lock build.rs configs/ci.toml 2>/dev/null; then
    echo "error: uncommitted changes to the sources or configs/ci.toml: commit them first" \
         "(the baseline names the commit it was measured with)" >&2
    exit 2
fi
if [[ -r /proc/loadavg ]]; then
    read -r load _ < /proc/loadavg
    echo "load average before the sweep: $load (a quiet machine gives a baseline that gates tightly)" >&2
fi

cargo build --release
key="$(./target/release/attnbench list --machine-key)"
out="results/baseline/ci/$key"
new="results/baseline/ci/$key.new"
others="$(ls -d results/baseline/ci/*/ 2> /dev/null | grep -v "/$key/$" || true)"
if [ -n "$others" ]; then
    echo "note: only $out is regenerated; when the change moves memory or the cases, also" \
         "run this on a machine of each other key:" $others >&2
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
git rev-parse HEAD > results/baseline/ci/ab-revision
# The new baseline passes against itself, or it is not a baseline.
./target/release/attnbench compare "$out" "$out" > /dev/null
echo "wrote $out ($(($(wc -l < "$out/runs.csv") - 1)) cases) and results/baseline/ci/ab-revision" \
     "($(cat results/baseline/ci/ab-revision)). Review, then commit them alone:"
echo "  git add $out results/baseline/ci/ab-revision && git commit -m 'CI baseline: <why the numbers move>'"
