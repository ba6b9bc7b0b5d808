#!/usr/bin/env bash
# Regenerates the report of every committed results directory (each folder under results/
# holding a runs.csv) into a scratch folder and compares it byte for byte with the
# committed one. Prints each file that differs or is missing; exits 1 if any.
# Usage: scripts/check-reports.sh [ATTNBENCH_BINARY]   (default ./target/release/attnbench)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-./target/release/attnbench}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
status=0
while IFS= read -r csv; do
    dir="$(dirname "$csv")"
    [ -d "$dir/report" ] || continue
    out="$tmp/$dir"
    mkdir -p "$out"
    if ! "$bin" report "$dir" --out "$out/report" > "$out/log" 2>&1; then
        echo "FAILED: attnbench report $dir"; cat "$out/log"; status=1; continue
    fi
    # Derived files the report writes beside report/ (decode.md, bpt.md, tree_vs_ring.*).
    for f in "$dir"/*.md "$dir"/*.svg "$dir"/*_counts.csv "$dir"/*_latency.csv; do
        [ -f "$f" ] || continue
        name="$(basename "$f")"
        [ "$name" = README.md ] && continue
        [ "$name" = table_full.md ] && continue
        if [ -f "$out/report/$name" ] && ! cmp -s "$f" "$out/report/$name"; then
            echo "differs: $f"; status=1
        fi
    done
    if ! diff -rq "$dir/report" "$out/report" --exclude=log; then status=1; fi
done < <(find results -name runs.csv -not -path '*/pass-*' | sort)
if [ "$status" = 0 ]; then echo "every committed report regenerates byte for byte"; fi
exit "$status"
