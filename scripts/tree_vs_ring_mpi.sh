#!/usr/bin/env bash
# Regenerates results/tree_vs_ring_mpi/ (issue 10): ring and tree decode on 2 and 4 MPI ranks
# on this machine (configs/tree_vs_ring_mpi.toml), then the alpha-beta fit. Needs Open MPI
# (docs/guide/mpi.md). About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --features mpi
out=results/tree_vs_ring_mpi
for p in 2 4; do
    mpirun --oversubscribe --allow-run-as-root -np "$p" target/release/attnbench sweep \
        --config configs/tree_vs_ring_mpi.toml --set devices="$p" --out "$out/p$p" --force
done
target/release/attnbench model fit "$out/p2" "$out/p4" --out "$out"
