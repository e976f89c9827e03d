#!/usr/bin/env bash
# One call for the prompt work (issues 18, 19) on a lent GPU machine (no Rust there): the GPU
# tests; Qwen3-30B-A3B Q4_0 with the grouped expert products on tensor cores and without
# (GGML_TP_MOE_MMA), its per-node profile; F16 prompts with the tensor-core attention at 8 and 4
# warps a block; BF16 pp512; llama.cpp on the same files; host phases of pp8192; tensor over two
# logical devices of the MoE model. TESTS=0 skips the tests, KERNEL_TESTS="A B" picks kernel
# cases. Output in $OUT/prompt.txt, a section per step.
# Here: cargo xtask device-pack --out .device-bin/NAME --test ggml-tp-tests:cuda_kernels \
#         --test ggml-tp-tests:conformance_cuda --test llama:logits_arch --program --fixtures arch
#       gzip -1 .device-bin/NAME/{ggml-tp,cuda_kernels,conformance_cuda,logits_arch}
#       cp -r ../shared/anchor scripts/device-prompt.sh .device-bin/NAME/
# There: bash .device-bin/NAME/device-prompt.sh (carry .device-bin/NAME; the device tool copies
# this checkout, so the pack must be under it).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
LOG=${OUT:?run this through the device tool}/prompt.txt
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
step() {
    local title=$1
    shift
    echo "## $title ($(($(date +%s) - T0)) s)" >>"$LOG"
    "$@" >>"$LOG" 2>&1
}
for f in *.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x ggml-tp cuda_kernels conformance_cuda logits_arch
chmod -R u+w anchor
mkdir -p /tmp/m /tmp/w
M=/tmp/m/llama3-8b-f16.gguf
Q=/tmp/m/qwen3-30b-a3b-q4_0.gguf
BF=/tmp/m/llama3-8b-bf16.gguf
LB=/tmp/w/lcpp/build/bin/llama-bench
[ -x $LB ] || (bash anchor/build-llama-bench.sh /tmp/w/lcpp >/tmp/w/lcpp_build.txt 2>&1; echo "build rc $?" >>/tmp/w/lcpp_build.txt) &
[ -s $Q ] || ./ggml-tp synth qwen3-30b-a3b-q4_0 -o $Q >/tmp/w/synthq.txt 2>&1 &
SYNTHQ=$!
[ -s $M ] || ./ggml-tp synth llama3-8b-f16 -o $M >/tmp/w/synth.txt 2>&1 &
SYNTH=$!
[ -s $BF ] || ./ggml-tp synth llama3-8b-bf16 -o $BF >/tmp/w/synthb.txt 2>&1 &
SYNTHB=$!
if [ "${TESTS:-1}" = 1 ]; then
    timeout 280 ./cuda_kernels ${KERNEL_TESTS:-} >/tmp/w/cuda_kernels.txt 2>&1 &
    T1=$!
    timeout 200 ./conformance_cuda >/tmp/w/conformance_cuda.txt 2>&1 &
    T2=$!
    GGML_TP_FIXTURES="$B/fx" timeout 100 ./logits_arch >/tmp/w/logits_arch.txt 2>&1 &
    T3=$!
    wait $T1 $T2 $T3
    for t in cuda_kernels conformance_cuda logits_arch; do step "$t" grep -v "running for over\|^test .* ok$" /tmp/w/$t.txt; done
fi
wait $SYNTHQ
step synthq cat /tmp/w/synthq.txt
for env in GGML_TP_MOE_MMA=1 GGML_TP_MOE_MMA=0; do
    step "qwen3-30b $env" env $env timeout 60 ./ggml-tp bench -m $Q --devices cuda:0 -p 512 -n 128 -r 2
done
step "qwen3-30b profile pp512" env GGML_TP_CUDA_PROFILE=1 timeout 60 ./ggml-tp bench -m $Q --devices cuda:0 -p 512 -n 0 -r 1
wait $SYNTH
step synth cat /tmp/w/synth.txt
for env in GGML_TP_ATTN_MMA_WARPS=8 GGML_TP_ATTN_MMA_WARPS=4; do
    for pu in 512,0 2048,512 8192,2048; do
        step "ggml-tp $env pp${pu%,*} u${pu#*,}" env $env timeout 60 ./ggml-tp bench -m $M \
            --devices cuda:0 -p "${pu%,*}" -u "${pu#*,}" -n 0 -r 2
    done
done
wait $SYNTHB
step synthb cat /tmp/w/synthb.txt
step "bf16 pp512" timeout 60 ./ggml-tp bench -m $BF --devices cuda:0 -p 512 -n 0 -r 3
step lcpp_build tail -2 /tmp/w/lcpp_build.txt
[ -x $LB ] || LB=true
step "llama.cpp qwen3-30b" timeout 60 $LB -m $Q -ngl 99 -fa 1 -dev CUDA0 -sm none -p 512 -n 128 -r 2 -o md
step "llama.cpp bf16" timeout 60 $LB -m $BF -ngl 99 -fa 1 -dev CUDA0 -sm none -p 512 -n 0 -r 3 -o md
for pu in 512,512 2048,512 8192,2048; do
    step "llama.cpp f16 pp${pu%,*} ub${pu#*,}" timeout 60 $LB -m $M -ngl 99 -fa 1 -dev CUDA0 -sm none \
        -p "${pu%,*}" -ub "${pu#*,}" -n 0 -r 2 -o md
done
step "timing pp8192" env GGML_TP_TIMING=1 timeout 60 ./ggml-tp bench -m $M --devices cuda:0 -p 8192 -u 2048 -n 0 -r 1
step "qwen3-30b tensor x2 logical tg16" env GGML_TP_CUDA_LOGICAL=2 GGML_TP_TIMING=1 timeout 60 ./ggml-tp bench -m $Q \
    --devices cuda:0,cuda:1 --split-mode tensor -p 0 -n 16 -r 1
