#!/usr/bin/env bash
# One call's decode measurements on a lent GPU machine (no Rust there), for the decode issue: the
# GPU tests, decode attention alone under its settings, and decode side by side with llama.cpp on the
# same synthetic files. Everything lands in $OUT/r (a file per step), each step under a timeout, so
# a slow step costs its own result only.
#
# Here:  cargo xtask device-pack --out .device-bin/NAME --test ggml-tp-tests:cuda_kernels \
#          --test ggml-tp-tests:conformance_cuda --test llama:logits_arch \
#          --example backend-cuda:gemv_bw --program --fixtures arch
#        gzip -1 .device-bin/NAME/{ggml-tp,cuda_kernels,conformance_cuda,logits_arch,gemv_bw}
#        cp -r ../shared/anchor scripts/device-decode.sh .device-bin/NAME/
# There: bash .device-bin/NAME/device-decode.sh [PRESET ...]   (default: llama3-8b-f16 llama3-8b-q4_0),
#        with `carry` naming .device-bin/NAME. llama-bench builds in the background (~270 s).
set -u
B=$(cd "$(dirname "$0")" && pwd)
R=${OUT:?run this through the device tool}/r
mkdir -p "$R" /tmp/w /tmp/m
export NCCL_NVLS_ENABLE=0
cd "$B"
for f in *.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x ggml-tp cuda_kernels conformance_cuda logits_arch gemv_bw
chmod -R u+w anchor
presets=("$@")
[ ${#presets[@]} -eq 0 ] && presets=(llama3-8b-f16 llama3-8b-q4_0)

(bash anchor/build-llama-bench.sh /tmp/w/lcpp >"$R/lcpp_build.txt" 2>&1; echo "build rc $?" >>"$R/lcpp_build.txt") &
LCPP=$!
(for p in "${presets[@]}"; do ./ggml-tp synth "$p" -o "/tmp/m/$p.gguf" || echo "synth $p failed"; done) >"$R/synth.txt" 2>&1 &
SYNTH=$!

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$R/gpu.txt" 2>&1
# Decode attention alone: the default, the previous kernel, and the plan's two settings.
for env in "" GGML_TP_ATTN_VEC=0 GGML_TP_ATTN_VEC_BLOCKS=128 GGML_TP_ATTN_VEC_BLOCKS=512; do
    echo "== ${env:-default}"
    env $env timeout 60 ./gemv_bw decode-attention 2>&1 | tail -9
done >"$R/attention.txt" 2>&1
(timeout 150 ./cuda_kernels 2>&1 || timeout 150 ./cuda_kernels --test-threads 1 2>&1) | tail -40 >"$R/cuda_kernels.txt"
timeout 120 ./conformance_cuda 2>&1 | tail -20 >"$R/conformance_cuda.txt"
GGML_TP_FIXTURES="$B/fx" timeout 150 ./logits_arch 2>&1 | tail -20 >"$R/logits_arch.txt"
wait $SYNTH
for p in "${presets[@]}"; do
    timeout 150 ./ggml-tp bench -m "/tmp/m/$p.gguf" --devices cuda:0 -p 0 -n 128 -r 3 -d 0,4096,32768 \
        >"$R/bench_$p.txt" 2>&1
done
wait $LCPP
for p in "${presets[@]}"; do
    timeout 150 /tmp/w/lcpp/build/bin/llama-bench -m "/tmp/m/$p.gguf" -ngl 99 -fa 1 -dev CUDA0 -sm none \
        -p 0 -n 128 -r 3 -d 0,4096,32768 -o md >"$R/llama_$p.txt" 2>&1
done
