#!/bin/sh
# Everything the GPU issues need, in one call on a GPU machine (the device
# tool returns at most 8 files, so each part's logs are packed into one
# tarball per part):
#
#   tests/gpu/run-all.sh OUTDIR PART...
#
# PART: ops (op parity + op benchmarks, tests/gpu/device-run.sh),
# model (whole-model parity, allocation check, DP equivalence, GPT-2 124M
# training: tests/gpu/model-run.sh), hf (transformers opens the exports made
# by tests/gpu/hf-prepare.sh into .device/hf), coll (NCCL collectives test on
# every GPU), train (bench/gpu_train.sh), scaling (bench/gpu_scaling.sh), fp8[:MODEL,STEPS]
# (tests/gpu/test_cuda_fp8, then bench/gpu_fp8.sh's bf16-vs-FP8 loss curves), attn:VAR=VALUE,...
# (GPT-2 124M tokens/s with the default attention and with each variant),
# profile[:CONFIG] (per-kernel step time and attention detail under ncu).
# Builds once into build-gpu (configured against .device/root) and shares it.
set -u
out=$1
shift
top=$PWD
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
dlib=$top/.device/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$top/build-gpu/src/.libs:$dlib:${LD_LIBRARY_PATH:-}"
export PKG_CONFIG_PATH=$dlib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$top/.device/root
ngpu=$(nvidia-smi -L | wc -l)
echo "== $(date -u +%FT%TZ) $ngpu GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
t0=$(date +%s)
if [ ! -f build-gpu/Makefile ]; then
    # configure and Makefile.in travel from the development machine (carry
    # them); the copy's timestamps must not make `make` rerun autotools,
    # which this machine lacks
    [ -x configure ] || { echo "carry configure, Makefile.in, aclocal.m4, build-aux, src/cai_config.h.in"; exit 1; }
    touch aclocal.m4 && sleep 1 && touch configure Makefile.in src/cai_config.h.in
    # cuDNN attention when cudnn-frontend's headers were carried in .device
    fe=
    [ -f .device/cudnn-frontend/include/cudnn_frontend.h ] && fe=--with-cudnn-frontend=$top/.device/cudnn-frontend/include
    mkdir -p build-gpu && (cd build-gpu && ../configure -q CC=mpicc --without-hdf5 --with-cuda=/usr/local/cuda \
        --with-nccl=/usr $fe >"$out/configure.log" 2>&1) || { tail -30 "$out/configure.log"; }
    grep -E "CUDA|NCCL|cuDNN" "$out/configure.log" | grep -v checking
fi
# BUILD_TARGETS: only these (a short call); default everything incl. the test programs
if [ -n "${BUILD_TARGETS:-}" ]; then
    # shellcheck disable=SC2086
    (cd build-gpu && make -j32 $BUILD_TARGETS >"$out/make.log" 2>&1)
else
    (cd build-gpu && make -j16 >"$out/make.log" 2>&1 && make -j16 check TESTS= >>"$out/make.log" 2>&1)
fi ||
    { grep -E "error|Error" "$out/make.log" | head -30; }
echo "== build: $(($(date +%s) - t0)) s"
for spec in "$@"; do
    # PART or PART:ARG,ARG (arguments for the bench scripts, e.g. train:gpt2-124m,dp)
    part=${spec%%:*}
    args=
    [ "$part" != "$spec" ] && args=$(echo "${spec#*:}" | tr , ' ')
    t=$(date +%s)
    d=$out/$part
    mkdir -p "$d"
    echo "== part $part"
    case $part in
    ops) mkdir -p .device/none && timeout "${OPS_TIMEOUT:-400}" tests/gpu/device-run.sh "$d" .device/none $args ;;
    model) timeout 480 tests/gpu/model-run.sh "$d" ;;
    hf)
        h=.device/hf
        timeout 200 python3 tests/gpu/hf_transformers.py --device cuda model $h/gpt2 $h/gpt2.logits \
            $h/llama $h/llama.logits $h/l16 $h/l16.logits 2>&1 | tail -12
        timeout 100 python3 tests/gpu/hf_transformers.py tokenizer $h/run $h/text.txt $h/text.ids 2>&1 | tail -6
        ;;
    coll)
        for n in 2 $ngpu; do
            timeout 200 tests/mpi/collectives-gpu-run.sh "$d/np$n" $n 2>&1 | tail -4
        done
        ;;
    attn)
        # a whole GPT-2 124M step with the default attention kernels and with
        # each variant named in ARGS (e.g. attn:CAI_CUDA_ATTN=flash)
        TORCH_MODES= timeout 150 bench/gpu_train.sh "$d/default" gpt2-124m 2>&1 | grep -E "c-gpt2|colossal \|"
        for v in $args; do
            env "$v" TORCH_MODES= timeout 150 bench/gpu_train.sh "$d/$(echo "$v" | tr = _)" gpt2-124m 2>&1 |
                grep -E "c-gpt2|colossal \|" | sed "s/^/$v: /"
        done
        ;;
    train) timeout "${TRAIN_TIMEOUT:-500}" bench/gpu_train.sh "$d" $args ;;
    fp8)
        # FP8 op tests, then the bf16-vs-FP8 loss curves (ARGS: MODEL STEPS)
        timeout 120 build-gpu/tests/gpu/test_cuda_fp8 2>&1 | tail -40
        timeout "${FP8_TIMEOUT:-480}" bench/gpu_fp8.sh "$d" $args
        ;;
    profile) timeout "${PROFILE_TIMEOUT:-400}" bench/gpu_profile.sh "$d" $args ;;
    scaling) timeout "${SCALING_TIMEOUT:-500}" bench/gpu_scaling.sh "$d" $args ;;
    *) echo "unknown part $part" ;;
    esac
    echo "== part $part: exit $?, $(($(date +%s) - t)) s"
    tar -czf "$out/$part.tgz" -C "$out" "$part" && rm -rf "${d:?}"
done
tar -czf "$out/build.tgz" -C "$out" $(cd "$out" && ls *.log 2>/dev/null) 2>/dev/null && rm -f "$out"/*.log
echo "== total $(($(date +%s) - t0)) s"
