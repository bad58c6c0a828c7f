#!/bin/sh
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang, ASan and
# UBSan against the library's own sources compiled the same way (the
# library proper builds with mpicc/gcc; these objects are separate).
#
#   tests/fuzz/build.sh SRCDIR BUILDDIR OUTDIR
#
# SRCDIR is the source tree, BUILDDIR a configured build tree (for
# src/cai_config.h), OUTDIR receives obj/*.o, libfuzzcore.a and the fuzz_*
# programs. Incremental: an object is rebuilt when its source or any header
# under src/ or tests/fuzz/ is newer. Environment: FUZZ_CC (clang),
# FUZZ_CFLAGS (extra flags), FUZZ_DEP_CFLAGS / FUZZ_DEP_LIBS (the
# dependencies' flags; make passes configure's), FUZZ_JOBS (2).
set -eu
srcdir=$(cd "$1" && pwd)
builddir=$(cd "$2" && pwd)
mkdir -p "$3/obj" "$3/bin"
out=$(cd "$3" && pwd)
cc=${FUZZ_CC:-clang}
jobs=${FUZZ_JOBS:-2}
mpi_cflags=$(mpicc --showme:compile 2>/dev/null || true)
mpi_libs=$(mpicc --showme:link 2>/dev/null || echo -lmpi)
dep_cflags=${FUZZ_DEP_CFLAGS-"$mpi_cflags $(pkg-config --cflags yaml-0.1 jansson hdf5-openmpi openblas 2>/dev/null || true)"}
dep_libs=${FUZZ_DEP_LIBS-"$(pkg-config --libs yaml-0.1 jansson hdf5-openmpi openblas 2>/dev/null || echo -lhdf5 -lyaml -ljansson -lopenblas)"}
# A host-only copy of the build's cai_config.h: the parsers under test need
# no device, and a CUDA build's library sources would pull in the CUDA
# headers and the nvcc-built kernels.
mkdir -p "$out/include"
sed -e 's/^#define CAI_HAVE_CUDA 1$/#define CAI_HAVE_CUDA 0/' -e 's/^#define CAI_HAVE_NCCL 1$/#define CAI_HAVE_NCCL 0/' \
    "$builddir/src/cai_config.h" >"$out/include/cai_config.h.new"
if cmp -s "$out/include/cai_config.h.new" "$out/include/cai_config.h"; then
    rm -f "$out/include/cai_config.h.new"
else
    mv "$out/include/cai_config.h.new" "$out/include/cai_config.h"
fi
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cflags="-std=c11 -g -O1 -fopenmp -D_GNU_SOURCE -Wall -Wno-unused-parameter -Wno-unknown-pragmas -Wno-pass-failed $san \
-I$out/include -I$srcdir/src/include -I$srcdir/src $dep_cflags $mpi_cflags ${FUZZ_CFLAGS:-}"

# newest library header: any change rebuilds every object (simple and safe)
stamp="$out/.headers"
hdr_new=$(find "$srcdir/src" "$out/include/cai_config.h" -name '*.h' -newer "$stamp" 2>/dev/null | head -n 1 || true)
if [ ! -f "$stamp" ] || [ -n "$hdr_new" ]; then
    rm -f "$out"/obj/*.o
    : >"$stamp"
fi

# the library sources (kernels/ are CUDA-only and not needed)
list="$out/sources.txt"
: >"$list"
for c in "$srcdir"/src/*/*.c; do
    o="$out/obj/$(basename "$(dirname "$c")")_$(basename "$c" .c).o"
    if [ ! -f "$o" ] || [ "$c" -nt "$o" ]; then echo "$c $o" >>"$list"; fi
done
if [ -s "$list" ]; then
    echo "fuzz: compiling $(wc -l <"$list") library sources with $cc"
    # shellcheck disable=SC2086
    xargs -P "$jobs" -L 1 sh -c "$cc $cflags -fsanitize=fuzzer-no-link -c \"\$0\" -o \"\$1\"" <"$list"
    rm -f "$out/libfuzzcore.a"
fi
[ -f "$out/libfuzzcore.a" ] || ar rcs "$out/libfuzzcore.a" "$out"/obj/*.o

for t in "$srcdir"/tests/fuzz/fuzz_*.c; do
    prog="$out/bin/$(basename "$t" .c)"
    if [ ! -x "$prog" ] || [ "$t" -nt "$prog" ] || [ "$out/libfuzzcore.a" -nt "$prog" ] ||
        [ -n "$(find "$srcdir/tests/fuzz" -name '*.h' -newer "$prog")" ]; then
        echo "fuzz: linking $(basename "$prog")"
        # shellcheck disable=SC2086
        $cc $cflags -fsanitize=fuzzer "$t" "$out/libfuzzcore.a" $dep_libs $mpi_libs -lm -o "$prog"
    fi
done
