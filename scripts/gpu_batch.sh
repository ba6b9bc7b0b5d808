#!/usr/bin/env bash
# GPU.md "Run there" in one go, on the GPU machine (no Rust, no network), from the repository
# root with .gpu/ built by scripts/gpu_build.sh. Everything goes to one folder OUT:
#
#   scripts/gpu_batch.sh OUT [STEP ...]   STEP: check smoke accept decode splits perf table2 papers plugins
#                                         (default: check smoke decode perf table2)
#
#   check   nvidia-smi, `attnbench list`, the unit tests of the CUDA backend (NVRTC compiles
#           every kernel for this device) and tests/gpu.rs with --include-ignored
#   smoke   configs/gpu_smoke.toml, then the PyTorch SDPA peer on the same cases
#   accept  configs/gpu_accept.toml (issue 8's acceptance shapes only), then the peer
#   decode  configs/gpu_decode.toml (flash-decoding; SDPA has no decode to compare)
#   splits  flash-decoding bf16 d128 over the 128k cache at 16, 98 and 396 splits (the
#           default's neighbourhood)
#   perf    configs/gpu_perf.toml, then the PyTorch SDPA peer (flash and efficient; the math
#           backend materializes every score and takes minutes at n = 16384: GPU_PEER_MATH=1
#           adds it); GPU_PERF_VARIANTS=flash (a comma list) times only those of ours
#   table2  configs/rabe_staats_table2_gpu.toml
#   papers  the same table as `attnbench reproduce rabe-staats --table table2_gpu` writes it
#           (OUT/papers/rabe-staats/table2_gpu: the paper table of issue 33)
#   plugins the CUDA plugin example (examples/plugins/cuda-naive, built here with nvcc) and
#           PyTorch SDPA's math, flash, efficient and cuDNN backends through attnbench-peer,
#           beside flash: configs/gpu_your_kernel.toml
# then reports again (with the peers' rows), scripts/gpu_acceptance.py -> OUT/acceptance.md,
# and OUT/gpu_results.tar.gz of the lot.
#
# GPU_SEED=gpu-<kind> continues the committed results instead of starting afresh (below).
#
# The whole batch keeps under a time budget (GPU_BATCH_BUDGET_S, default 570 s: one device
# call is capped at 600 s): each step gets what is left, a step cut short leaves its rows
# (CSV rows are flushed one by one) and a line in OUT/steps.txt, and running the same
# command again resumes the sweeps (`--resume`) where they stopped.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: scripts/gpu_batch.sh OUT [check|smoke|perf|table2 ...]}"
shift
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(check smoke decode perf table2)
BUDGET="${GPU_BATCH_BUDGET_S:-570}"
START=$(date +%s)
mkdir -p "$OUT"
# The binaries travel packed (scripts/gpu_build.sh).
if [ -f .gpu/bins.tar.xz ]; then
    tar xJf .gpu/bins.tar.xz -C .gpu || { echo "cannot unpack .gpu/bins.tar.xz" >> "$OUT/steps.txt"; exit 1; }
fi
BIN=.gpu/attnbench
export ATTNBENCH_BIN="$PWD/$BIN"
# NVRTC and cuBLAS from the toolkit when the loader does not find them by itself; failing
# that, from the NVIDIA wheels of the machine's Python (PyTorch's).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
for lib in libnvrtc.so libcublas.so; do
    if ! ldconfig -p | grep -q "$lib" && ! ls $(echo "${LD_LIBRARY_PATH:-}" | tr : " ") 2>/dev/null | grep -q "^$lib"; then
        f=$(find /usr/local /opt /usr/lib -name "$lib*" 2>/dev/null | head -1)
        [ -n "$f" ] && export LD_LIBRARY_PATH="$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
done
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" >> "$OUT/steps.txt"

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# run CAP_S LOG CMD...: runs CMD with min(CAP_S, budget left - 20 s) seconds, appends its
# outcome to OUT/steps.txt.
run() {
    local cap=$1 log=$2
    shift 2
    local t
    t=$(left)
    t=$(( t - 20 < cap ? t - 20 : cap ))
    if [ "$t" -le 5 ]; then
        echo "not run (time budget spent): $*" >> "$OUT/steps.txt"
        return 0
    fi
    local t0
    t0=$(date +%s)
    timeout "$t" "$@" >> "$OUT/$log" 2>&1
    local rc=$?
    echo "rc=$rc ($(( $(date +%s) - t0 )) s, cap ${t} s): $*" >> "$OUT/steps.txt"
    return 0
}

# GPU_SEED=gpu-h200: each sweep starts from the committed results/<config>/gpu-h200/ (its
# runs.csv, samples.csv and meta.json), so --resume runs only the cases missing there (the
# resume is recorded in meta.json's `resumed`; case ids hold the thread count, so this
# matches on a machine of the same core count). GPU_SEED_ONLY="rabe_staats_table2_gpu ..."
# limits it to those configs (a perf comparison wants ours and the peer from one call).
seed() {
    local src="results/$1/${GPU_SEED:-}"
    if [ -n "${GPU_SEED:-}" ] && [ -f "$src/runs.csv" ] && [ ! -f "$OUT/$1/runs.csv" ]; then
        mkdir -p "$OUT/$1"
        cp "$src/runs.csv" "$src/meta.json" "$OUT/$1/"
        [ -f "$src/samples.csv" ] && cp "$src/samples.csv" "$OUT/$1/"
        echo "seeded $1 from $src ($(($(wc -l < "$src/runs.csv") - 1)) rows)" >> "$OUT/steps.txt"
    fi
}
# The output folders of the sweeps below (OUT/<name>).
SWEEPS="gpu_smoke gpu_accept gpu_decode gpu_decode_splits gpu_perf rabe_staats_table2_gpu gpu_your_kernel"
for d in ${GPU_SEED_ONLY:-$SWEEPS}; do
    seed "$d"
done

for step in "${STEPS[@]}"; do
    case "$step" in
    check)
        { nvidia-smi; nvidia-smi -q -d CLOCK,POWER,PERFORMANCE; } > "$OUT/nvidia-smi.txt" 2>&1
        run 30 list.txt "$BIN" list
        for t in .gpu/attnbench-*; do
            run 90 tests-unit.txt "$t" backend::cuda --include-ignored
        done
        for t in .gpu/gpu-*; do
            run 150 tests-gpu.txt "$t" --include-ignored --test-threads 1
        done
        ;;
    smoke)
        run 150 smoke.log "$BIN" sweep --config configs/gpu_smoke.toml --out "$OUT/gpu_smoke" --resume
        run 90 smoke.log python3 scripts/peers/torch_sdpa.py --device cuda --config configs/gpu_smoke.toml --out "$OUT/gpu_smoke" --resume
        ;;
    accept)
        run 120 accept.log "$BIN" sweep --config configs/gpu_accept.toml --out "$OUT/gpu_accept" --resume
        run 90 accept.log python3 scripts/peers/torch_sdpa.py --device cuda --config configs/gpu_accept.toml --out "$OUT/gpu_accept" --resume
        ;;
    decode)
        run 120 decode.log "$BIN" sweep --config configs/gpu_decode.toml --out "$OUT/gpu_decode" --resume
        ;;
    splits)
        run 60 decode.log "$BIN" sweep --config configs/gpu_decode.toml --out "$OUT/gpu_decode_splits" --resume \
            --set dtype=bf16 --set head_dim=128 --set seq_kv=131072 --set splits=16,98,396
        ;;
    perf)
        peers=torch-sdpa-flash,torch-sdpa-efficient
        [ "${GPU_PEER_MATH:-0}" = 1 ] && peers=$peers,torch-sdpa-math
        # The config lists flash first: a sweep cut short by its cap still has flash's rows
        # for the peer's ratio.
        # GPU_PERF_VARIANTS=flash times only those of ours (a kernel change, its peer again).
        vs=()
        [ -n "${GPU_PERF_VARIANTS:-}" ] && vs=(--set "variant=$GPU_PERF_VARIANTS")
        run "${GPU_PERF_CAP_S:-200}" perf.log "$BIN" sweep --config configs/gpu_perf.toml --out "$OUT/gpu_perf" --resume "${vs[@]}"
        run 200 perf.log python3 scripts/peers/torch_sdpa.py --device cuda --config configs/gpu_perf.toml --out "$OUT/gpu_perf" --resume --variants "$peers"
        ;;
    table2)
        run 240 table2.log "$BIN" sweep --config configs/rabe_staats_table2_gpu.toml --out "$OUT/rabe_staats_table2_gpu" --resume
        ;;
    papers)
        # The GPU's paper table as `reproduce` makes it (interleaved, judged): copy
        # OUT/papers/rabe-staats/table2_gpu into results/papers/rabe-staats/ and run
        # `attnbench reproduce rabe-staats --report-only` at home for its claims.
        run 240 papers.log "$BIN" reproduce rabe-staats --table table2_gpu --out "$OUT/papers" --resume
        ;;
    plugins)
        # nvcc from the toolkit; the plugin must exist before the config loads.
        [ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
        mkdir -p target/plugins
        run 120 plugins.log nvcc -O3 -shared -Xcompiler -fPIC -I include \
            examples/plugins/cuda-naive/naive.cu -o target/plugins/libcuda_naive.so
        run 300 plugins.log "$BIN" sweep --config configs/gpu_your_kernel.toml --out "$OUT/gpu_your_kernel" --resume
        ;;
    *)
        echo "unknown step $step (expected check, smoke, accept, decode, splits, perf, table2, papers, plugins)" >> "$OUT/steps.txt"
        ;;
    esac
done

for d in $SWEEPS; do
    [ -f "$OUT/$d/runs.csv" ] && "$BIN" report "$OUT/$d" >> "$OUT/report.log" 2>&1
done
python3 scripts/gpu_acceptance.py "$OUT" > "$OUT/acceptance.md" 2>> "$OUT/report.log"
echo "total $(( $(date +%s) - START )) s" >> "$OUT/steps.txt"
tmp="$(mktemp -d)"
tar czf "$tmp/gpu_results.tar.gz" -C "$OUT" --exclude gpu_results.tar.gz . \
    && mv "$tmp/gpu_results.tar.gz" "$OUT/gpu_results.tar.gz"
rm -rf "$tmp"
cat "$OUT/steps.txt"
