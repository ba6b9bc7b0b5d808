#!/usr/bin/env bash
# GPU.md "Build here": on the development machine (no GPU, no CUDA toolkit needed), build the
# release binary and the test executables that matter on the GPU machine with the `cuda`
# feature, strip their debug info (the device tool carries at most 64 MiB) and put them in
# .gpu/ (ignored by git):
#   .gpu/attnbench          the CLI (sweeps, report, list)
#   .gpu/attnbench-<hash>   the library's unit tests (NVRTC compile of every kernel for the
#                           device, launch planning, accounting)
#   .gpu/gpu-<hash>         tests/gpu.rs (the oracle, memory and timing tests on the GPU)
# The CPU-only integration tests are not copied: the GPU machine checks the GPU.
#
#   scripts/gpu_build.sh && ls -la .gpu
#
# Then, on the GPU machine, from the repository root: scripts/gpu_batch.sh OUT
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --features cuda
cargo test --release --features cuda --no-run --message-format=json 2>/dev/null \
    | jq -r 'select(.executable != null and .target.kind != null)
             | select((.target.kind | index("lib")) or .target.name == "gpu")
             | .executable' > .gpu-testbins.txt
rm -rf .gpu
mkdir -p .gpu
cp target/release/attnbench .gpu/
xargs -a .gpu-testbins.txt cp -t .gpu/
rm -f .gpu-testbins.txt
for f in .gpu/*; do
    strip --strip-debug "$f"
done
ls -la .gpu
du -sh .gpu
