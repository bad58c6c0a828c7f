#!/bin/sh
# Runs the GPU parity tests and op benchmarks on a GPU machine and writes the
# logs to OUTDIR. Used for the H200 runs recorded in docs/cuda.md:
#
#   tests/gpu/device-run.sh OUTDIR [PREBUILT] [SANITIZE_FILTER]
#
# PREBUILT (default .device/cuda) holds test_cuda_ops, bench_cuda_ops and
# libcolossal-core.so.0 built elsewhere; when they cannot run here the script
# builds them (configure with the libraries unpacked under .device/root, as
# docs/cuda.md describes). SANITIZE_FILTER, when given, reruns the tests
# whose group name contains it under compute-sanitizer memcheck. RUN_TORCH=0
# skips the PyTorch reference timings.
set -u
out=${1:-/tmp/gpu-out}
pre=${2:-.device/cuda}
san=${3:-}
top=$PWD
mkdir -p "$out"
dlib=$top/.device/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$top/$pre:$dlib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv

bin=$top/$pre
if [ ! -x "$bin/test_cuda_ops" ] || ldd "$bin/test_cuda_ops" | grep -q "not found" ||
    ! "$bin/test_cuda_ops" no-such-group >/dev/null 2>&1; then
    echo "prebuilt binaries unusable here; building"
    ldd "$bin/test_cuda_ops" 2>&1 | grep "not found"
    export PKG_CONFIG_PATH=$dlib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$top/.device/root
    mkdir -p build-gpu && cd build-gpu &&
        { [ -f Makefile ] || ../configure -q CC=mpicc --without-hdf5 --with-cuda=/usr/local/cuda --with-nccl=/usr \
            >"$out/configure.log" 2>&1; } &&
        make -j16 tests/gpu/test_cuda_ops tests/gpu/bench_cuda_ops >"$out/make.log" 2>&1 ||
        { tail -n 40 "$out/configure.log" "$out/make.log"; exit 1; }
    cd "$top"
    bin=$top/build-gpu/tests/gpu/.libs
    export LD_LIBRARY_PATH="$top/build-gpu/src/.libs:$dlib:${LD_LIBRARY_PATH:-}"
fi

echo "== parity tests"
timeout 150 "$bin/test_cuda_ops" >"$out/test.log" 2>&1
echo "test_cuda_ops exit $?"
grep -E "FAIL|checks passed|device error|FATAL" "$out/test.log"
echo "== op benchmarks"
timeout 150 "$bin/bench_cuda_ops" 20 >"$out/bench.log" 2>&1
echo "bench_cuda_ops exit $?"
if [ "${RUN_TORCH:-1}" = 1 ] && [ -f tests/gpu/torch_ref.py ]; then
    echo "== PyTorch reference"
    timeout 90 python3 tests/gpu/torch_ref.py 20 >"$out/torch.log" 2>&1
    echo "torch_ref exit $?"
fi
if [ -n "$san" ]; then
    echo "== compute-sanitizer memcheck ($san)"
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda_ops" "$san" >"$out/memcheck.log" 2>&1
    echo "memcheck exit $?"
    tail -4 "$out/memcheck.log"
fi
cat "$out/bench.log" "$out/torch.log" 2>/dev/null | cut -c1-150
