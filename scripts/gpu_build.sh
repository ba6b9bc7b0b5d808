#!/usr/bin/env bash
# GPU.md "Build here": on the development machine (no GPU, no CUDA toolkit needed), build the
# release binary and the test executables that matter on the GPU machine with the `cuda`
# feature, strip their debug info and pack them into .gpu/bins.tar.xz (ignored by git; about
# 4 MiB instead of 17: the device tool carries at most 64 MiB, the repository included):
#   attnbench          the CLI (sweeps, report, list)
#   attnbench-<hash>   the library's unit tests (NVRTC compile of every kernel for the
#                      device, launch planning, accounting)
#   gpu-<hash>         tests/gpu.rs (the oracle, memory and timing tests on the GPU)
# scripts/gpu_batch.sh unpacks them into .gpu/ on the GPU machine.
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
(cd .gpu && tar cJf bins.tar.xz --remove-files ./*)
tar tvJf .gpu/bins.tar.xz
du -sh .gpu
