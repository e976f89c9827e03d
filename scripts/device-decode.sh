#!/usr/bin/env bash
# One call's decode measurements on a lent GPU machine (no Rust there), for the decode issue: the
# GPU tests, the GEMV of every type alone and decode under the default settings and one other
# setting ($AB, the same-run A/B), and decode side by side with llama.cpp on the same synthetic
# files. Everything lands in one file, $OUT/decode.txt (the device tool returns few files), a
# section per step, each step under a timeout, so a slow step costs its own result only; what ran
# before a timeout still comes back.
#
# Here:  cargo xtask device-pack --out .device-bin/NAME --test ggml-tp-tests:cuda_kernels \
#          --test ggml-tp-tests:conformance_cuda --test llama:logits_arch \
#          --example backend-cuda:gemv_bw --program --fixtures arch
#        gzip -1 .device-bin/NAME/{ggml-tp,cuda_kernels,conformance_cuda,logits_arch,gemv_bw}
#        cp -r ../shared/anchor scripts/device-decode.sh .device-bin/NAME/
# There: bash .device-bin/NAME/device-decode.sh [PRESET ...] with `carry` naming .device-bin/NAME;
#        presets default to llama3-8b-f16 llama3-8b-q4_0. Environment: DEPTHS (default
#        0,4096,32768), AB (default GGML_TP_GEMV_ROW_PAIRS=0; `none`: no A/B runs; several settings
#        separated by `;`, each its own runs), ATTN=1 (decode attention alone too), PROFILE=1 (the
#        per-node GPU time of 32 tokens of the first preset), NCU=REGEX (Nsight Compute's warp
#        states, stall sites and occupancy of the kernels whose names match, in a decode step of
#        the first preset), GEMV=0 (no GEMV runs), LLAMA_CPP=0 (no llama.cpp; else llama-bench
#        builds in the background, ~270 s), LOGICAL=N (the first preset also in split modes none
#        and tensor over N logical devices of the GPU, pp512 and tg128: the tensor-parallel
#        overhead). A program file in the folder given as
#        GGML_TP_CUDA_PROGRAM=NAME.cu in AB is found there (kernel variants A/B without a Rust
#        build; `cargo run --release -p backend-cuda --example ptx -- NAME.cu` writes one).
set -u
B=$(cd "$(dirname "$0")" && pwd)
LOG=${OUT:?run this through the device tool}/decode.txt
mkdir -p /tmp/w /tmp/m
export NCCL_NVLS_ENABLE=0
cd "$B"
T0=$(date +%s)
# Appends a section: its title and seconds since the start, then what the command prints.
step() {
    local title=$1
    shift
    echo "## $title ($(($(date +%s) - T0)) s)" >>"$LOG"
    "$@" >>"$LOG" 2>&1
}
for f in *.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x ggml-tp cuda_kernels conformance_cuda logits_arch gemv_bw
[ -d anchor ] && chmod -R u+w anchor
presets=("$@")
depths=${DEPTHS:-0,4096,32768}
ab=${AB:-GGML_TP_GEMV_ROW_PAIRS=0}
settings=("")
if [ "$ab" != none ]; then
    IFS=';' read -r -a more <<<"$ab"
    settings+=("${more[@]}")
fi
[ ${#presets[@]} -eq 0 ] && presets=(llama3-8b-f16 llama3-8b-q4_0)

[ "${LLAMA_CPP:-1}" = 1 ] && (bash anchor/build-llama-bench.sh /tmp/w/lcpp >/tmp/w/lcpp_build.txt 2>&1; echo "build rc $?" >>/tmp/w/lcpp_build.txt) &
LCPP=$!
(for p in "${presets[@]}"; do ./ggml-tp synth "$p" -o "/tmp/m/$p.gguf" || echo "synth $p failed"; done) >/tmp/w/synth.txt 2>&1 &
SYNTH=$!

step gpu nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
# Decode attention alone (with ATTN=1); the GEMV of every type under the default settings and $ab.
[ "${ATTN:-0}" = 1 ] && step "decode attention" timeout 120 ./gemv_bw decode-attention
if [ "${GEMV:-1}" = 1 ]; then
    for env in "${settings[@]}"; do
        step "gemv ${env:-default}" env $env timeout 80 ./gemv_bw gemv
    done
fi
# The GPU tests side by side (correctness only; nothing is timed while they run).
tests=()
timeout 300 ./cuda_kernels >/tmp/w/cuda_kernels.txt 2>&1 &
tests+=($!)
timeout 200 ./conformance_cuda >/tmp/w/conformance_cuda.txt 2>&1 &
tests+=($!)
GGML_TP_FIXTURES="$B/fx" timeout 200 ./logits_arch >/tmp/w/logits_arch.txt 2>&1 &
tests+=($!)
wait "${tests[@]}"
for t in cuda_kernels conformance_cuda logits_arch; do step "$t" cat /tmp/w/$t.txt; done
wait $SYNTH
step synth cat /tmp/w/synth.txt
# Each preset under the default settings and under $ab (same run: the A/B of that setting).
for p in "${presets[@]}"; do
    for env in "${settings[@]}"; do
        step "ggml-tp $p ${env:-default}" env $env timeout 150 ./ggml-tp bench -m "/tmp/m/$p.gguf" \
            --devices cuda:0 -p 0 -n 128 -r 3 -d "$depths"
    done
done
if [ -n "${LOGICAL:-}" ]; then
    devs=$(seq -s, -f 'cuda:%g' 0 $((LOGICAL - 1)))
    step "ggml-tp ${presets[0]} over $LOGICAL logical devices" env GGML_TP_CUDA_LOGICAL="$LOGICAL" timeout 200 \
        ./ggml-tp bench -m "/tmp/m/${presets[0]}.gguf" --devices "$devs" --split-mode none,tensor -p 512 -n 128 -r 3
fi
[ "${PROFILE:-0}" = 1 ] && step "profile ${presets[0]}" env GGML_TP_CUDA_PROFILE=1 timeout 120 ./ggml-tp bench \
    -m "/tmp/m/${presets[0]}.gguf" --devices cuda:0 -p 0 -n 32 -r 1
[ -n "${NCU:-}" ] && step "ncu ${presets[0]} $NCU" timeout 240 ncu --graph-profiling node -k "regex:$NCU" \
    --launch-skip 200 --launch-count 12 --section WarpStateStats --section SourceCounters \
    --section LaunchStats --section Occupancy --section SpeedOfLight ./ggml-tp bench \
    -m "/tmp/m/${presets[0]}.gguf" --devices cuda:0 -p 0 -n 8 -r 1
[ "${LLAMA_CPP:-1}" = 1 ] || exit 0
wait $LCPP
step lcpp_build tail -3 /tmp/w/lcpp_build.txt
for p in "${presets[@]}"; do
    step "llama.cpp $p" timeout 150 /tmp/w/lcpp/build/bin/llama-bench -m "/tmp/m/$p.gguf" -ngl 99 -fa 1 \
        -dev CUDA0 -sm none -p 0 -n 128 -r 3 -d "$depths" -o md
done
