#!/usr/bin/env bash
# The whole GPU table in one call on a lent GPU machine (no Rust there): the GPU tests, then decode
# (issue 17), prompts (issue 19), the MoE model (issue 18) and tensor mode over two logical devices
# of the GPU (issue 20) with ggml-tp, and llama.cpp on the same files. With ggml-tp-old in the folder
# every ggml-tp row runs with it too (the A/B of two builds); AB_ENV="NAME=VALUE ..." runs the
# ggml-tp rows once more with those settings. Output in $OUT/table.txt, a section per step, each
# under a timeout, so a slow step costs its own result only. (It replaces device-prompt.sh and
# device-ab.sh.)
# Environment: LLAMA_CPP=0 (no llama.cpp; its build takes ~270 s in the background), TESTS=0 (no
# GPU tests), KERNEL_TESTS (cuda_kernels filters; default all), DECODE=0 / PROMPT=0 / MOE=0 /
# LOGICAL=0 (leave out those rows), NEXT=PRESET (also a delta-net model, e.g. qwen3.5-27b-q4_0),
# PROFILE=1 (each build's per-node GPU time of an F16 pp8192, the new build's of F16 and Q4_0 decode), LONG=1 (a micro-batch of 2048 after
# 30720 cached tokens: attention at 32k keys, with ggml-tp's profile), NCU=1 (Nsight Compute on
# k_flash_attn_mma_d128 at 8192 keys, the report in $OUT/fa.ncu-rep),
# LOGITS_AB="NAME=VALUE ..." (logits_arch once more with those settings),
# TRACE=N (the MoE tensor run prints each stream's last N calls, GGML_TP_CUDA_TRACE), LOGICAL_AB=
# "NAME=VALUE ...;..." (the F16 and MoE tensor runs once more under each setting).
# OLD_ROWS="GROUP ...": ggml-tp-old runs only those groups' rows (decode, prompt, moe, next,
# logical; default all of them).
# Here: cargo xtask device-pack --out .device-bin/NAME --test ggml-tp-tests:cuda_kernels \
#         --test ggml-tp-tests:conformance_cuda --test llama:logits_arch --program --fixtures arch
#       gzip -1 .device-bin/NAME/{ggml-tp,cuda_kernels,conformance_cuda,logits_arch}
#       cp -r ../shared/anchor scripts/device-table.sh .device-bin/NAME/
#       (an A/B: the other build stripped to .device-bin/NAME/ggml-tp-old and gzipped too)
# There: bash .device-bin/NAME/device-table.sh (carry .device-bin/NAME).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
LOG=${OUT:?run this through the device tool}/table.txt
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
step() {
    local title=$1
    shift
    echo "## $title ($(($(date +%s) - T0)) s)" >>"$LOG"
    "$@" >>"$LOG" 2>&1
}
for f in *.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x ggml-tp* cuda_kernels conformance_cuda logits_arch 2>/dev/null
[ -d anchor ] && chmod -R u+w anchor
mkdir -p /tmp/m /tmp/w
bins=(ggml-tp)
[ -x ggml-tp-old ] && bins+=(ggml-tp-old)
M_F16=/tmp/m/llama3-8b-f16.gguf
M_Q40=/tmp/m/llama3-8b-q4_0.gguf
M_MOE=/tmp/m/qwen3-30b-a3b-q4_0.gguf
M_NXT=/tmp/m/${NEXT:-none}.gguf
LB=/tmp/w/lcpp/build/bin/llama-bench
on() { [ "${!1:-1}" != 0 ]; }

step gpu nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
LCPP=
if on LLAMA_CPP && [ ! -x $LB ]; then
    (nice -n 19 bash anchor/build-llama-bench.sh /tmp/w/lcpp >/tmp/w/lcpp_build.txt 2>&1
        echo "build rc $?" >>/tmp/w/lcpp_build.txt) &
    LCPP=$!
fi
(
    synth() { [ -s "$2" ] || ./ggml-tp synth "$1" -o "$2" || echo "synth $1 failed"; }
    synth llama3-8b-f16 $M_F16
    synth llama3-8b-q4_0 $M_Q40
    if on MOE || on LOGICAL; then synth qwen3-30b-a3b-q4_0 $M_MOE; fi
    [ -n "${NEXT:-}" ] && synth "$NEXT" "$M_NXT"
    # The old build compiles its kernel program now, so that no timed run waits on it.
    [ -x ggml-tp-old ] && ./ggml-tp-old bench -m $M_Q40 --devices cuda:0 -p 16 -n 0 -r 1 >/dev/null
) >/tmp/w/synth.txt 2>&1 &
SYNTH=$!
if on TESTS; then
    timeout 300 ./cuda_kernels ${KERNEL_TESTS:-} >/tmp/w/k.txt 2>&1 &
    t1=$!
    timeout 240 ./conformance_cuda >/tmp/w/c.txt 2>&1 &
    t2=$!
    (GGML_TP_FIXTURES="$B/fx" timeout 200 ./logits_arch
        [ -z "${LOGITS_AB:-}" ] || env $LOGITS_AB GGML_TP_FIXTURES="$B/fx" timeout 200 ./logits_arch) >/tmp/w/l.txt 2>&1 &
    t3=$!
    wait $t1 $t2 $t3
    step cuda_kernels grep -v "^test .* ok$" /tmp/w/k.txt
    step conformance_cuda grep -v "running for over\|^test .* ok$" /tmp/w/c.txt
    step logits_arch grep -v "^test .* ok$" /tmp/w/l.txt
fi
wait $SYNTH
step synth cat /tmp/w/synth.txt
# Each ggml-tp row with every build, then with $AB_ENV.
tp() {
    local title=$1
    shift
    for bin in "${use[@]}"; do step "$bin $title" timeout 120 ./$bin bench "$@"; done
    [ -z "${AB_ENV:-}" ] || step "ggml-tp $title with $AB_ENV" env $AB_ENV timeout 120 ./ggml-tp bench "$@"
}
lcpp() {
    local title=$1
    shift
    on LLAMA_CPP && step "llama.cpp $title" timeout 150 $LB -ngl 99 -fa 1 -dev CUDA0 -sm none -o md "$@"
}
one=(--devices cuda:0)
# The builds that run group $1's rows.
builds_for() {
    use=("${bins[@]}")
    case " ${OLD_ROWS:-all} " in *" all "* | *" $1 "*) ;; *) use=(ggml-tp) ;; esac
}
builds_for decode
if on DECODE; then
    tp "f16 decode" -m $M_F16 "${one[@]}" -p 0 -n 128 -r 3 -d 0,4096
    tp "q4_0 decode" -m $M_Q40 "${one[@]}" -p 0 -n 128 -r 3 -d 0,4096
fi
builds_for prompt
if on PROMPT; then
    tp "f16 pp512" -m $M_F16 "${one[@]}" -p 512 -n 0 -r 3
    tp "f16 pp2048 u512" -m $M_F16 "${one[@]}" -p 2048 -u 512 -n 0 -r 2
    tp "f16 pp8192 u2048" -m $M_F16 "${one[@]}" -p 8192 -u 2048 -n 0 -r 2
fi
# Top nodes of a per-node profile (GGML_TP_CUDA_PROFILE) of `ggml-tp bench ARGS` with build $1.
profile() {
    local bin=$1 lines=$2 title=$3
    shift 3
    step "profile $bin $title" sh -c "GGML_TP_CUDA_PROFILE=1 timeout 120 ./$bin bench $* 2>&1 |
        grep -v '^| ---\|^loaded\|^memory' | head -$lines"
}
if [ "${PROFILE:-0}" = 1 ]; then
    for bin in "${use[@]}"; do profile $bin 24 pp8192 -m $M_F16 "${one[@]}" -p 8192 -u 2048 -n 0 -r 1; done
    profile ggml-tp 20 "f16 tg32" -m $M_F16 "${one[@]}" -p 0 -n 32 -r 1
    profile ggml-tp 20 "q4_0 tg32" -m $M_Q40 "${one[@]}" -p 0 -n 32 -r 1
fi
[ "${LONG:-0}" = 1 ] && profile ggml-tp 16 "pp2048 at depth 30720" -m $M_F16 "${one[@]}" -p 2048 -u 2048 -d 30720 -n 0 -r 1
if [ "${NCU:-0}" = 1 ]; then
    step "ncu k_flash_attn_mma_d128 at 8192 keys" timeout 150 ncu --graph-profiling node -k regex:k_flash_attn_mma_d128 \
        --launch-skip 96 --launch-count 1 --set full -o $OUT/fa ./ggml-tp bench -m $M_F16 "${one[@]}" -p 8192 -u 2048 -n 0 -r 1
    step "ncu details" ncu -i $OUT/fa.ncu-rep --page details
fi
builds_for moe
on MOE && tp "qwen3-30b" -m $M_MOE "${one[@]}" -p 512 -n 128 -r 2
builds_for next
[ -n "${NEXT:-}" ] && tp "$NEXT" -m $M_NXT "${one[@]}" -p 512 -n 128 -r 2
if on LLAMA_CPP; then
    [ -n "$LCPP" ] && wait $LCPP
    step lcpp_build tail -2 /tmp/w/lcpp_build.txt
fi
if on DECODE; then
    lcpp "f16 decode" -m $M_F16 -p 0 -n 128 -r 3 -d 0,4096
    lcpp "q4_0 decode" -m $M_Q40 -p 0 -n 128 -r 3 -d 0,4096
fi
if on PROMPT; then
    lcpp "f16 pp512" -m $M_F16 -p 512 -n 0 -r 3
    lcpp "f16 pp2048 ub512" -m $M_F16 -p 2048 -ub 512 -n 0 -r 2
    lcpp "f16 pp8192 ub2048" -m $M_F16 -p 8192 -ub 2048 -n 0 -r 2
fi
[ "${LONG:-0}" = 1 ] && lcpp "f16 pp2048 ub2048 at depth 30720" -m $M_F16 -p 2048 -ub 2048 -d 30720 -n 0 -r 1
on MOE && lcpp "qwen3-30b" -m $M_MOE -p 512 -n 128 -r 2
[ -n "${NEXT:-}" ] && lcpp "$NEXT" -m $M_NXT -p 512 -n 128 -r 2
# Last: tensor mode over logical devices has no llama.cpp row to lose if the call runs out.
if on LOGICAL; then
    two=(--devices cuda:0,cuda:1 --split-mode none,tensor)
    export GGML_TP_CUDA_LOGICAL=2
    builds_for logical
    tp "f16 over 2 logical" -m $M_F16 "${two[@]}" -p 512 -n 128 -r 3
    IFS=';' read -r -a more <<<"${LOGICAL_AB:-}"
    for env in "${more[@]}"; do
        step "f16 over 2 logical with $env" env $env timeout 120 ./ggml-tp bench -m $M_F16 --devices cuda:0,cuda:1 \
            --split-mode tensor -p 512 -n 128 -r 3
    done
    tp "f16 pp2048 u512 over 2 logical" -m $M_F16 "${two[@]}" -p 2048 -u 512 -n 0 -r 2
    tp "qwen3-30b over 2 logical" -m $M_MOE "${two[@]}" -p 0 -n 32 -r 2
    step "qwen3-30b over 2 logical, counters" env GGML_TP_META_STATS=1 GGML_TP_CUDA_STATS=1 \
        GGML_TP_CUDA_TRACE="${TRACE:-0}" timeout 120 ./ggml-tp bench -m $M_MOE "${two[@]}" -p 0 -n 32 -r 1
    for env in "${more[@]}"; do
        step "qwen3-30b over 2 logical with $env" env $env timeout 120 ./ggml-tp bench -m $M_MOE "${two[@]}" \
            -p 0 -n 32 -r 2
    done
    unset GGML_TP_CUDA_LOGICAL
fi
exit 0
