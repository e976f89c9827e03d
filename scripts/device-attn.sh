#!/usr/bin/env bash
# One call for the prompt-attention work on a lent GPU machine (no Rust there): the GPU tests,
# F16 prompts (pp512, pp2048 `-u 512`, pp8192 `-u 2048`) with the tensor-core attention and
# without it (GGML_TP_ATTN_MMA=0), llama.cpp on the same file, the host phases of pp8192
# (GGML_TP_TIMING); PROFILE=1: its per-node GPU time; LOGICAL=N: split modes none and tensor over
# N logical devices; KERNEL_TESTS=FILTER: only those kernel cases. Output in $OUT/attn.txt, a
# section per step.
# Here: cargo xtask device-pack --out .device-bin/NAME --test ggml-tp-tests:cuda_kernels \
#         --test ggml-tp-tests:conformance_cuda --test llama:logits_arch --program --fixtures arch
#       gzip -1 .device-bin/NAME/{ggml-tp,cuda_kernels,conformance_cuda,logits_arch}
#       cp -r ../shared/anchor scripts/device-attn.sh .device-bin/NAME/
# There: bash .device-bin/NAME/device-attn.sh (carry .device-bin/NAME).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
LOG=${OUT:?run this through the device tool}/attn.txt
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
LB=/tmp/w/lcpp/build/bin/llama-bench
(bash anchor/build-llama-bench.sh /tmp/w/lcpp >/tmp/w/lcpp_build.txt 2>&1; echo "build rc $?" >>/tmp/w/lcpp_build.txt) &
LCPP=$!
./ggml-tp synth llama3-8b-f16 -o $M >/tmp/w/synth.txt 2>&1 &
SYNTH=$!
timeout 300 ./cuda_kernels ${KERNEL_TESTS:-} >/tmp/w/cuda_kernels.txt 2>&1 &
T1=$!
timeout 200 ./conformance_cuda >/tmp/w/conformance_cuda.txt 2>&1 &
T2=$!
GGML_TP_FIXTURES="$B/fx" timeout 100 ./logits_arch >/tmp/w/logits_arch.txt 2>&1 &
T3=$!
wait $SYNTH
step synth cat /tmp/w/synth.txt
wait $T1 $T2 $T3
for t in cuda_kernels conformance_cuda logits_arch; do step "$t" grep -v "running for over\|^test .* ok$" /tmp/w/$t.txt; done
wait $LCPP
step lcpp_build tail -2 /tmp/w/lcpp_build.txt
for env in "" GGML_TP_ATTN_MMA=0; do
    for pu in 512,0 2048,512 8192,2048; do
        step "ggml-tp ${env:-default} pp${pu%,*} u${pu#*,}" env $env timeout 100 ./ggml-tp bench -m $M \
            --devices cuda:0 -p "${pu%,*}" -u "${pu#*,}" -n 0 -r 3
    done
done
for pu in 512,512 2048,512 8192,2048; do
    step "llama.cpp pp${pu%,*} ub${pu#*,}" timeout 100 $LB -m $M -ngl 99 -fa 1 -dev CUDA0 -sm none \
        -p "${pu%,*}" -ub "${pu#*,}" -n 0 -r 3 -o md
done
step "timing pp8192" env GGML_TP_TIMING=1 timeout 100 ./ggml-tp bench -m $M --devices cuda:0 -p 8192 -u 2048 -n 0 -r 1
[ "${PROFILE:-0}" = 1 ] && step "profile pp8192" env GGML_TP_CUDA_PROFILE=1 timeout 100 ./ggml-tp bench -m $M \
    --devices cuda:0 -p 8192 -u 2048 -n 0 -r 1
if [ -n "${LOGICAL:-}" ]; then
    devs=$(seq -s, -f 'cuda:%g' 0 $((LOGICAL - 1)))
    step "over $LOGICAL logical devices" env GGML_TP_CUDA_LOGICAL="$LOGICAL" timeout 150 ./ggml-tp bench -m $M \
        --devices "$devs" --split-mode none,tensor -p 512,2048 -u 512 -n 128 -r 3
fi
