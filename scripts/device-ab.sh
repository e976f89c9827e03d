#!/usr/bin/env bash
# A/B of two builds of the program on a lent GPU machine (no Rust there), for the prompt work
# (issues 18, 19): the GPU tests of the new build; F16 prompts of 8192 / 2048 / 512 tokens with the
# new build (ggml-tp) and the one it is compared with (ggml-tp-old), their per-node profiles at
# pp8192; Qwen3-30B-A3B Q4_0 pp512 both ways; llama.cpp on the same files; with NCU=1, Nsight
# Compute on the new build's k_flash_attn_mma_d128 at 8192 keys. Output in $OUT/out.txt. The old
# build compiles its kernel program (NVRTC) while the tests run, so that no timed run waits on it.
# KERNEL_TESTS: the cuda_kernels filters (default "attention flash moe"); MOE=0 leaves out
# Qwen3-30B-A3B, LLAMA_CPP=0 llama.cpp (its build takes ~5 minutes of the call); LONG=1 adds a
# micro-batch of 2048 after 30720 cached tokens (attention at 32k keys) with the new build's profile;
# AB_ENV="NAME=VALUE ..." runs the new build's F16 prompts once more with those settings.
# Here: cargo xtask device-pack --out .device-bin/NAME --test ggml-tp-tests:cuda_kernels \
#         --test ggml-tp-tests:conformance_cuda --test llama:logits_arch --program --fixtures arch
#       git stash; cargo build --release -p ggml-tp; strip -o .device-bin/NAME/ggml-tp-old \
#         target/release/ggml-tp; git stash pop   (or a checkout of the other commit)
#       gzip -1 .device-bin/NAME/{ggml-tp,ggml-tp-old,cuda_kernels,conformance_cuda,logits_arch}
#       cp -r ../shared/anchor scripts/device-ab.sh .device-bin/NAME/
# There: bash .device-bin/NAME/device-ab.sh (carry .device-bin/NAME).
set -u
B=$(cd "$(dirname "$0")" && pwd); cd "$B"
LOG=$OUT/out.txt; export NCCL_NVLS_ENABLE=0; T0=$(date +%s)
step() { local t=$1; shift; echo "## $t ($(($(date +%s) - T0)) s)" >>"$LOG"; "$@" >>"$LOG" 2>&1; }
for f in *.gz; do gunzip -f "$f"; done
chmod +x ggml-tp ggml-tp-old cuda_kernels conformance_cuda logits_arch; chmod -R u+w anchor
mkdir -p /tmp/m /tmp/w; M=/tmp/m/llama3-8b-f16.gguf; Q=/tmp/m/qwen3-30b-a3b-q4_0.gguf; LB=/tmp/w/lcpp/build/bin/llama-bench
[ "${LLAMA_CPP:-1}" = 0 ] || [ -x $LB ] || (nice -n 19 bash anchor/build-llama-bench.sh /tmp/w/lcpp >/tmp/w/lcpp_build.txt 2>&1; echo "build rc $?" >>/tmp/w/lcpp_build.txt) &
LBP=$!
([ -s $M ] || ./ggml-tp synth llama3-8b-f16 -o $M; ./ggml-tp-old bench -m $M --devices cuda:0 -p 16 -n 0 -r 1) \
    >/tmp/w/synth.txt 2>&1 &
SYNTH=$!
[ "${MOE:-1}" = 0 ] || [ -s $Q ] || ./ggml-tp synth qwen3-30b-a3b-q4_0 -o $Q >/tmp/w/synthq.txt 2>&1 &
SYNTHQ=$!
timeout 300 ./cuda_kernels ${KERNEL_TESTS:-attention flash moe} >/tmp/w/k.txt 2>&1 & T1=$!
timeout 240 ./conformance_cuda >/tmp/w/c.txt 2>&1 & T2=$!
GGML_TP_FIXTURES="$B/fx" timeout 120 ./logits_arch >/tmp/w/l.txt 2>&1 & T3=$!
wait $T1 $T2 $T3
step cuda_kernels grep -v "^test .* ok$" /tmp/w/k.txt
step conformance_cuda grep -v "running for over\|^test .* ok$" /tmp/w/c.txt
step logits_arch grep -v "^test .* ok$" /tmp/w/l.txt
wait $SYNTH; step synth cat /tmp/w/synth.txt
for pu in 8192,2048 2048,512; do
  for bin in ggml-tp ggml-tp-old; do
    step "$bin f16 pp${pu%,*} u${pu#*,}" timeout 60 ./$bin bench -m $M --devices cuda:0 -p "${pu%,*}" -u "${pu#*,}" -n 0 -r 2
  done
  [ -z "${AB_ENV:-}" ] || step "ggml-tp with $AB_ENV f16 pp${pu%,*} u${pu#*,}" env $AB_ENV timeout 60 ./ggml-tp bench -m $M \
    --devices cuda:0 -p "${pu%,*}" -u "${pu#*,}" -n 0 -r 2
done
for bin in ggml-tp ggml-tp-old; do
  step "profile $bin pp8192" sh -c "GGML_TP_CUDA_PROFILE=1 timeout 60 ./$bin bench -m $M --devices cuda:0 -p 8192 -u 2048 -n 0 -r 1 2>&1 | grep -v '^| ---\|^loaded\|^memory' | head -24"
done
lcpp() { [ "${LLAMA_CPP:-1}" = 0 ] || step "llama.cpp $1" timeout 60 $LB -ngl 99 -fa 1 -dev CUDA0 -sm none -n 0 -r 2 \
  -o md "${@:2}"; }
if [ "${LLAMA_CPP:-1}" != 0 ]; then wait $LBP; step lcpp_build tail -2 /tmp/w/lcpp_build.txt; fi
for pu in 8192,2048 2048,512; do lcpp "f16 pp${pu%,*} ub${pu#*,}" -m $M -p "${pu%,*}" -ub "${pu#*,}"; done
if [ "${MOE:-1}" != 0 ]; then
  wait $SYNTHQ; step synthq tail -2 /tmp/w/synthq.txt
  for bin in ggml-tp ggml-tp-old; do
    step "$bin qwen3-30b pp512" timeout 60 ./$bin bench -m $Q --devices cuda:0 -p 512 -n 0 -r 2
  done
  lcpp "qwen3-30b pp512" -m $Q -p 512
fi
for bin in ggml-tp ggml-tp-old; do
  step "$bin f16 pp512" timeout 60 ./$bin bench -m $M --devices cuda:0 -p 512 -n 0 -r 2
done
lcpp "f16 pp512" -m $M -p 512
if [ "${LONG:-0}" = 1 ]; then
  step "profile ggml-tp pp2048 at depth 30720" sh -c "GGML_TP_CUDA_PROFILE=1 timeout 120 ./ggml-tp bench -m $M \
    --devices cuda:0 -p 2048 -u 2048 -d 30720 -n 0 -r 1 2>&1 | grep -v '^| ---\|^loaded\|^memory' | head -16"
  lcpp "f16 pp2048 ub2048 at depth 30720" -m $M -p 2048 -ub 2048 -d 30720
fi
if [ "${NCU:-0}" = 1 ]; then
  step "ncu k_flash_attn_mma_d128 at 8192 keys" timeout 150 ncu --graph-profiling node -k regex:k_flash_attn_mma_d128 \
    --launch-skip 96 --launch-count 1 --set full -o $OUT/fa ./ggml-tp bench -m $M --devices cuda:0 -p 8192 -u 2048 -n 0 -r 1
  step "ncu details" ncu -i $OUT/fa.ncu-rep --page details
fi
step done true
