#!/usr/bin/env bash
# One call's prompt measurements on a lent GPU machine (no Rust there), for the prefill issue and
# the tensor-parallel and MoE ones: the GPU tests, then prompt processing of the first preset at
# pp512, pp2048 (`-u 512`) and pp8192 (`-u 2048`) under the default settings and each of $AB (the
# same-run A/B), the other presets at pp512 and tg128, and llama.cpp on the same files. Everything
# lands in $OUT/prompt.txt, a section per step, each step under a timeout.
#
# Here:  cargo xtask device-pack --out .device-bin/NAME --test ggml-tp-tests:cuda_kernels \
#          --test ggml-tp-tests:conformance_cuda --test llama:logits_arch --program --fixtures arch
#        gzip -1 .device-bin/NAME/{ggml-tp,cuda_kernels,conformance_cuda,logits_arch}
#        cp -r ../shared/anchor scripts/device-prompt.sh .device-bin/NAME/
# There: bash .device-bin/NAME/device-prompt.sh PRESET [PRESET ...] with `carry` naming
#        .device-bin/NAME. Environment: AB (default GGML_TP_ATTN_MMA=0; `none`: no A/B runs; several
#        settings separated by `;`), TESTS=0 (no GPU tests), LLAMA_CPP=0 (no llama.cpp; else
#        llama-bench builds in the background, ~270 s), LOGICAL=N (the first preset and, with
#        LOGICAL_MORE, those presets too, in split modes none and tensor over N logical devices:
#        pp512, pp2048 with `-u 512`, tg128).
set -u
B=$(cd "$(dirname "$0")" && pwd)
LOG=${OUT:?run this through the device tool}/prompt.txt
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
chmod +x ggml-tp
[ -d anchor ] && chmod -R u+w anchor
presets=("$@")
[ ${#presets[@]} -eq 0 ] && presets=(llama3-8b-f16)
ab=${AB:-GGML_TP_ATTN_MMA=0}
settings=("")
if [ "$ab" != none ]; then
    IFS=';' read -r -a more <<<"$ab"
    settings+=("${more[@]}")
fi
LB=/tmp/w/lcpp/build/bin/llama-bench
[ "${LLAMA_CPP:-1}" = 1 ] && [ ! -x $LB ] && (bash anchor/build-llama-bench.sh /tmp/w/lcpp >/tmp/w/lcpp_build.txt 2>&1; echo "build rc $?" >>/tmp/w/lcpp_build.txt) &
LCPP=$!
(for p in "${presets[@]}"; do [ -e "/tmp/m/$p.gguf" ] || ./ggml-tp synth "$p" -o "/tmp/m/$p.gguf" || echo "synth $p failed"; done) >/tmp/w/synth.txt 2>&1 &
SYNTH=$!

step gpu nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
if [ "${TESTS:-1}" = 1 ]; then
    chmod +x cuda_kernels conformance_cuda logits_arch
    tests=()
    timeout 300 ./cuda_kernels >/tmp/w/cuda_kernels.txt 2>&1 &
    tests+=($!)
    timeout 200 ./conformance_cuda >/tmp/w/conformance_cuda.txt 2>&1 &
    tests+=($!)
    GGML_TP_FIXTURES="$B/fx" timeout 200 ./logits_arch >/tmp/w/logits_arch.txt 2>&1 &
    tests+=($!)
    wait "${tests[@]}"
    for t in cuda_kernels conformance_cuda logits_arch; do step "$t" cat /tmp/w/$t.txt; done
fi
wait $SYNTH
step synth cat /tmp/w/synth.txt
first=${presets[0]}
for env in "${settings[@]}"; do
    for pu in 512,0 2048,512 8192,2048; do
        step "ggml-tp $first pp${pu%,*} u${pu#*,} ${env:-default}" env $env timeout 150 ./ggml-tp bench \
            -m "/tmp/m/$first.gguf" --devices cuda:0 -p "${pu%,*}" -u "${pu#*,}" -n 0 -r 3
    done
done
for p in "${presets[@]:1}"; do
    step "ggml-tp $p" timeout 150 ./ggml-tp bench -m "/tmp/m/$p.gguf" --devices cuda:0 -p 512 -n 128 -r 3
done
[ "${LLAMA_CPP:-1}" = 1 ] && wait $LCPP && step lcpp_build tail -3 /tmp/w/lcpp_build.txt
if [ -n "${LOGICAL:-}" ]; then
    devs=$(seq -s, -f 'cuda:%g' 0 $((LOGICAL - 1)))
    for p in "$first" ${LOGICAL_MORE:-}; do
        step "ggml-tp $p over $LOGICAL logical devices" env GGML_TP_CUDA_LOGICAL="$LOGICAL" timeout 240 \
            ./ggml-tp bench -m "/tmp/m/$p.gguf" --devices "$devs" --split-mode none,tensor -p 512,2048 -u 512 \
            -n 128 -r 3
    done
fi
[ "${LLAMA_CPP:-1}" = 1 ] || exit 0
for pu in 512,512 2048,512 8192,2048; do
    step "llama.cpp $first pp${pu%,*} ub${pu#*,}" timeout 150 $LB -m "/tmp/m/$first.gguf" -ngl 99 -fa 1 \
        -dev CUDA0 -sm none -p "${pu%,*}" -ub "${pu#*,}" -n 0 -r 3 -o md
done
for p in "${presets[@]:1}"; do
    step "llama.cpp $p" timeout 150 $LB -m "/tmp/m/$p.gguf" -ngl 99 -fa 1 -dev CUDA0 -sm none -p 512 -n 128 -r 3 -o md
done
