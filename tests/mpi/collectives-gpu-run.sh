#!/bin/sh
# Device-buffer collectives on a GPU machine (docs/cluster.md, "Tests"):
#
#   tests/mpi/collectives-gpu-run.sh OUTDIR [NP]      (from the repository root)
#
# Configures build-gpu/ against the libraries unpacked in .device/root (as
# tests/gpu/device-run.sh does) unless it is configured already, builds
# tests/mpi/test_collectives_gpu2 and runs it on NP ranks (default 2), one GPU
# each. BENCH=1 adds the bandwidth bench (--bench). Logs in OUTDIR; the exit
# status is the test's.
set -u
out=${1:?usage: tests/mpi/collectives-gpu-run.sh OUTDIR [NP]}
np=${2:-2}
top=$PWD
mkdir -p "$out"
dlib=$top/.device/root/usr/lib/x86_64-linux-gnu
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$top/build-gpu/src/.libs:$dlib:${LD_LIBRARY_PATH:-}"
if [ ! -f build-gpu/Makefile ]; then
    export PKG_CONFIG_PATH=$dlib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$top/.device/root
    mkdir -p build-gpu &&
        (cd build-gpu && ../configure -q --without-hdf5 --with-cuda=/usr/local/cuda --with-nccl=/usr) \
            >"$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
fi
(cd build-gpu && make -j16 tests/mpi/test_collectives_gpu2) >"$out/make.log" 2>&1 || { tail -40 "$out/make.log"; exit 1; }
bench=
[ "${BENCH:-0}" = 1 ] && bench=--bench
start=$(date +%s)
timeout 400 mpirun --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np "$np" \
    build-gpu/tests/mpi/test_collectives_gpu2 $bench >"$out/collectives_gpu.log" 2>&1
rc=$?
echo "test_collectives_gpu2 on $np ranks: exit $rc after $(($(date +%s) - start)) s"
grep -E "FAIL|passed|checks over|NCCL watchdog report|mesh free|s$|busbw" "$out/collectives_gpu.log" | cut -c1-200 | head -60
exit $rc
