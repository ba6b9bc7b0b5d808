#!/usr/bin/env bash
# Regenerates the report of every committed results directory (each folder under results/
# holding a runs.csv) into a scratch folder and compares it byte for byte with the
# committed one: report/ where one is committed, and the derived files beside runs.csv
# (decode.md, paging.svg, prefill.md, prefill.svg, bpt.md, tree_vs_ring.*).
# Prints each file that differs or is missing; exits 1 if any.
# Usage: scripts/check-reports.sh [ATTNBENCH_BINARY]   (default ./target/release/attnbench)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-./target/release/attnbench}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
status=0
derived="decode.md paging.svg prefill.md prefill.svg bpt.md bpt_budget_sweep.csv bpt_budget_sweep.svg tree_vs_ring.md tree_vs_ring.svg tree_vs_ring_latency.csv"
while IFS= read -r csv; do
    dir="$(dirname "$csv")"
    out="$tmp/$dir"
    mkdir -p "$out"
    if ! "$bin" report "$dir" --out "$out/report" > "$out/log" 2>&1; then
        echo "FAILED: attnbench report $dir"; cat "$out/log"; status=1; continue
    fi
    # The derived files report regenerates beside runs.csv (with --out: in it).
    for name in $derived; do
        if [ -f "$dir/$name" ] || [ -f "$out/report/$name" ]; then
            if ! cmp -s "$dir/$name" "$out/report/$name"; then
                echo "differs: $dir/$name"; status=1
            fi
        fi
    done
    # index.html is not committed (.gitignore): it repeats the plots.
    # shellcheck disable=SC2046 # one --exclude per derived file name
    if [ -d "$dir/report" ] && ! diff -rq "$dir/report" "$out/report" --exclude=log \
        --exclude=index.html \
        $(printf -- '--exclude=%s ' $derived); then
        status=1
    fi
done < <(find results -name runs.csv -not -path '*/pass-*' | sort)
if [ "$status" = 0 ]; then echo "every committed report regenerates byte for byte"; fi
exit "$status"
