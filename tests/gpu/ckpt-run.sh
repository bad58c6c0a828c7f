#!/bin/bash
# Checkpoint save -> resume from GPU memory, bit for bit (issue 17 item 10):
#
#   tests/gpu/ckpt-run.sh OUTDIR        (from the root of a tree, e.g. the
#                                        .device/src of tests/gpu/snapshot.sh)
#
# The GPU machine has only serial HDF5: Debian 12's parallel HDF5 packages,
# unpacked here beforehand (run on the development machine, from the
# repository root; .debs/ and .device/ are git-ignored):
#
#   mkdir -p .debs/fallback && (cd .debs && apt-get download libhdf5-openmpi-103-1 \
#     libhdf5-openmpi-dev libsz2 libaec0 libyaml-0-2 libyaml-dev libjansson4 libjansson-dev)
#   (cd .debs/fallback && apt-get download libcurl4 libnghttp2-14 libidn2-0 librtmp1 \
#     libssh2-1 libpsl5 libgssapi-krb5-2 libldap-2.5-0 libbrotli1 libunistring2 libkrb5-3 \
#     libk5crypto3 libkrb5support0 libkeyutils1 libsasl2-2 libsasl2-modules-db)
#   for f in .debs/*.deb; do dpkg -x $f .device/root; done
#   for f in .debs/fallback/*.deb; do dpkg -x $f .device/fallback; done
#
# libhdf5_openmpi.so.103 needs libmpi.so.40 (OpenMPI 4.x: Debian's 4.1.4,
# the GPU machine's 4.1.6), libcurl.so.4 and libcrypto.so.3; .device/fallback
# (Debian's libcurl and what it needs) is put on LD_LIBRARY_PATH only when
# ldd finds a library missing. Configured with
# --with-hdf5=.device/root/usr/lib/x86_64-linux-gnu/hdf5/openmpi (Debian's
# include/ and lib/ links there), CUDA, NCCL, and cuDNN attention when
# .device/cudnn-frontend/include was carried.
#
# Then, for each ZeRO stage (STAGES, default "0 3"), one rank, bf16:
#   a   STEPS steps uninterrupted, a checkpoint every STEPS/2 steps
#   b   the same stopped at STEPS/2 (train.stop_at: checkpoint, exit 3),
#       then resumed with --checkpoint.resume=latest up to STEPS
# and compares: every step's loss, grad norm and lr as printed in the
# metrics.jsonl files (%.9g: an f32 exactly); every dataset of a's and b's
# checkpoints at STEPS/2 and STEPS, byte for byte (h5py, raw reads with the
# file's own type); the bf16 datasets read back through h5py's conversion to
# f32 equal their raw bits << 16; colossal-ckpt verify (every checksum).
# Logs in OUTDIR: build.log, runs.log, metrics.jsonl, compare.txt,
# summary.txt. Exit status 0 when everything matched.
#
# Environment: STAGES, STEPS (default 20), CONFIG (default
# bench/configs/gpt2-124m.yaml), EXTRA (more colossal-pretrain options,
# default "--train.micro_batch 8"), PRECISION (default bf16), RUN_DEVICE
# (default cuda; cpu, with PRECISION=f32, checks the
# script on a CPU build), BUILD (build directory, default build-gpu-h5;
# configured when it has no Makefile), SKIP_BUILD=1, WORK (scratch, default
# /tmp/colossal-ckpt-run).
set -u
out=${1:?usage: tests/gpu/ckpt-run.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
top=$PWD
[ -f "$top/tests/gpu/ckpt-run.sh" ] || { echo "run from the root of a tree"; exit 2; }
t_start=$(date +%s)
STAGES=${STAGES:-0 3}
STEPS=${STEPS:-20}
HALF=$((STEPS / 2))
CONFIG=${CONFIG:-$top/bench/configs/gpt2-124m.yaml}
EXTRA=${EXTRA:---train.micro_batch 8}
DEVICE=${RUN_DEVICE:-cuda}
PRECISION=${PRECISION:-bf16}
WORK=${WORK:-/tmp/colossal-ckpt-run}
PY=${PYTHON:-python3}
NCPU=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 4)
root=$top/.device/root
dlib=$root/usr/lib/x86_64-linux-gnu
h5=$dlib/hdf5/openmpi
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export LD_LIBRARY_PATH="$dlib:${LD_LIBRARY_PATH:-}"
summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - t_start)); }
rev=$(cat "$top/REVISION" 2>/dev/null || git -C "$top" rev-parse --short HEAD 2>/dev/null)
note "# $(date -u +%FT%TZ) $(uname -n), tree ${rev:-?}, device $DEVICE"
command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$summary"

# ------------------------------------------------------------ HDF5 vs MPI
lib=$dlib/libhdf5_openmpi.so.103
[ -f "$lib" ] || { note "no $lib: unpack the .debs into .device/root (see the header)"; exit 2; }
ldd "$lib" >"$out/ldd.txt" 2>&1
if grep -q "not found" "$out/ldd.txt"; then
    note "missing for libhdf5_openmpi: $(grep 'not found' "$out/ldd.txt" | awk '{print $1}' | tr '\n' ' ')-> adding .device/fallback"
    export LD_LIBRARY_PATH="$dlib:$top/.device/fallback/usr/lib/x86_64-linux-gnu:$top/.device/fallback/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
    ldd "$lib" >"$out/ldd.txt" 2>&1
fi
note "MPI: $(mpirun --version 2>&1 | head -1); libhdf5_openmpi.so.103 ->" \
    "$(grep -E 'lib(mpi|curl|crypto|sz)\.so' "$out/ldd.txt" | awk '{print $1, $3}' | tr '\n' ' ')"
grep -q "not found" "$out/ldd.txt" && { note "still missing: $(grep 'not found' "$out/ldd.txt")"; exit 1; }

# ------------------------------------------------------------ build
B=${BUILD:-$top/build-gpu-h5}
case $B in /*) ;; *) B=$top/$B ;; esac
echo "== build in $B ($(elapsed) s)"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    (
        export PKG_CONFIG_PATH=$dlib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root
        if [ ! -f "$B/Makefile" ]; then
            # carried autotools outputs must look newer than their sources
            # where automake is absent (the GPU machine), as run-all.sh does
            command -v automake >/dev/null 2>&1 ||
                (cd "$top" && touch aclocal.m4 && sleep 1 && touch configure Makefile.in src/cai_config.h.in)
            cuda="--with-cuda=/usr/local/cuda --with-nccl=/usr"
            [ "$DEVICE" = cpu ] && cuda=--without-cuda
            fe=
            [ "$DEVICE" != cpu ] && [ -f "$top/.device/cudnn-frontend/include/cudnn_frontend.h" ] &&
                fe=--with-cudnn-frontend=$top/.device/cudnn-frontend/include
            mkdir -p "$B" && cd "$B" || exit 1
            echo "+ configure CC=mpicc $cuda --with-hdf5=$h5 $fe"
            # shellcheck disable=SC2086
            "$top/configure" -q CC=mpicc $cuda --with-hdf5="$h5" $fe || exit 1
        fi
        cd "$B" && make -j"$NCPU" src/libcolossal-core.la apps/colossal-pretrain apps/colossal-ckpt
    ) >"$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -20; tail -30 "$out/build.log"; note "build: FAIL"; exit 1; }
fi
grep -E "parallel HDF5|CUDA  |NCCL  |cuDNN" "$out/build.log" | sed 's/^ */configure: /' | tee -a "$summary"
PRETRAIN=$B/apps/.libs/colossal-pretrain
[ -x "$PRETRAIN" ] || PRETRAIN=$B/apps/colossal-pretrain
CKPT=$B/apps/.libs/colossal-ckpt
[ -x "$CKPT" ] || CKPT=$B/apps/colossal-ckpt
export LD_LIBRARY_PATH="$B/src/.libs:$LD_LIBRARY_PATH"
note "build: ok ($(elapsed) s); $(ldd "$PRETRAIN" | grep -E 'libhdf5|libmpi\.' | awk '{print $1, $3}' | tr '\n' ' ')"
MPI=(mpirun --allow-run-as-root -n 1 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS)

# ------------------------------------------------------------ data
# The embedded corpus and its BPE, made once (as bench/gpu_common.sh).
mkdir -p "$WORK"
DATA=$WORK/data
if [ ! -f "$DATA/data/corpus.idx" ]; then
    rm -rf "$DATA"
    "${MPI[@]}" "$PRETRAIN" --config "$top/bench/configs/tiny.yaml" --run.device=cpu --train.steps=1 \
        --optim.warmup_steps=0 --run.dir="$DATA" --data.corpus_docs=20000 --data.corpus_vocab=8192 \
        >"$WORK/prepare.log" 2>&1 || { tail -20 "$WORK/prepare.log"; note "data: FAIL"; exit 1; }
fi
note "data: $DATA ($(elapsed) s)"
ARGS=(--config "$CONFIG" --run.device="$DEVICE" --precision="$PRECISION" --train.steps="$STEPS" --checkpoint.every="$HALF"
      --log.interval=5 --data.path="$DATA/data/corpus" --data.tokenizer="$DATA/tokenizer")
# shellcheck disable=SC2206
ARGS+=($EXTRA)

: >"$out/runs.log"
: >"$out/metrics.jsonl"
# pt TAG RUNDIR ARGS...: one colossal-pretrain run; its exit status in $rc.
pt() {
    tag=$1 dir=$2
    shift 2
    echo "=== $tag: mpirun -n 1 colossal-pretrain ${ARGS[*]/#$top\//} --run.dir=$dir $*" >>"$out/runs.log"
    t=$(date +%s)
    timeout 200 "${MPI[@]}" "$PRETRAIN" "${ARGS[@]}" --run.dir="$dir" "$@" >>"$out/runs.log" 2>&1
    rc=$?
    echo "=== $tag: exit $rc, $(($(date +%s) - t)) s" >>"$out/runs.log"
}

fails=0
for st in $STAGES; do
    a=$WORK/z$st-a b=$WORK/z$st-b
    rm -rf "$a" "$b"
    pt "zero$st a (uninterrupted)" "$a" --zero.stage="$st"
    rca=$rc
    pt "zero$st b (stopped at $HALF)" "$b" --zero.stage="$st" --train.stop_at="$HALF"
    rcb1=$rc
    pt "zero$st b (resumed)" "$b" --zero.stage="$st" --checkpoint.resume=latest
    rcb2=$rc
    for r in a b; do sed "s/^{/{\"run\":\"zero$st-$r\",/" "$WORK/z$st-$r/metrics.jsonl" >>"$out/metrics.jsonl" 2>/dev/null; done
    note "zero $st: exit a $rca, b stop $rcb1 (3 expected), b resume $rcb2"
    if [ "$rca" != 0 ] || [ "$rcb1" != 3 ] || [ "$rcb2" != 0 ]; then
        fails=$((fails + 1))
        continue
    fi
    n1=$(printf 'step-%08d.h5' "$HALF") n2=$(printf 'step-%08d.h5' "$STEPS")
    (
        echo "== zero $st"
        "$PY" - "$a/metrics.jsonl" "$b/metrics.jsonl" <<'EOF'
import re, sys
def recs(path):
    out = {}
    for line in open(path):
        if '"kind":"train"' in line:
            f = dict(re.findall(r'"(step|loss|lr|grad_norm)":([^,}]*)', line))
            out[int(f["step"])] = (f["loss"], f["grad_norm"], f["lr"])
    return out
a, b = recs(sys.argv[1]), recs(sys.argv[2])
same = [s for s in a if b.get(s) == a[s]]
diff = sorted(s for s in set(a) | set(b) if a.get(s) != b.get(s))
print("losses: %d steps, %d bitwise equal (loss, grad_norm, lr as printed)%s" % (
    len(a), len(same), "" if not diff else "; DIFFER at steps %s" % diff[:10]))
for s in sorted(a):
    print("  step %3d loss %s %s" % (s, a[s][0], "=" if b.get(s) == a[s] else "!= %s" % (b.get(s),)))
sys.exit(1 if diff or not a else 0)
EOF
        r1=$?
        r2=0
        for n in "$n1" "$n2"; do
            echo "-- $n"
            "$PY" - "$a/checkpoints/$n" "$b/checkpoints/$n" <<'EOF' || r2=1
import sys, h5py, numpy as np
def datasets(f):
    d = {}
    f.visititems(lambda name, o: d.__setitem__(name, o) if isinstance(o, h5py.Dataset) else None)
    return d
def raw(ds):  # the stored bytes: read with the file's own type (no conversion)
    n = int(np.prod(ds.shape)) if ds.shape else 1
    buf = np.empty(n * ds.id.get_type().get_size(), np.uint8)
    if n:
        ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, buf, mtype=ds.id.get_type())
    return buf
def attrs(f):
    a = {}
    def grab(name, o):
        for k, v in o.attrs.items():
            a["%s@%s" % (name, k)] = v
    grab("/", f)
    f.visititems(grab)
    return a
fa, fb = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
da, db = datasets(fa), datasets(fb)
nbytes = same = bf16 = bf16_ok = stored = 0
bad, expected = [], []
# The tensors are virtual views of the stored /storage/* datasets: compare
# the stored ones first, and the views byte by byte only to name what differs
# (equal storage makes them equal) and to read the bf16 ones back.
names = sorted(set(da) | set(db), key=lambda n: (da[n].is_virtual if n in da else True, n))
for name in names:
    if name not in da or name not in db or da[name].shape != db[name].shape:
        bad.append(name)
        continue
    t = da[name].id.get_type()
    is_bf16 = isinstance(t, h5py.h5t.TypeFloatID) and t.get_size() == 2 and t.get_ebias() == 127
    if da[name].is_virtual and not bad and not is_bf16:
        same += 1
        continue
    x = raw(da[name])
    if not da[name].is_virtual:
        stored += 1
        nbytes += x.size
    if np.array_equal(x, raw(db[name])):
        same += 1
    elif name == "config.yaml":  # the runs' own options (train.stop_at, checkpoint.resume)
        expected.append(name)
    else:
        bad.append(name)
    if is_bf16:
        # bf16 (custom float type): h5py/HDF5's conversion to f32 must give
        # exactly the raw bits << 16
        bf16 += 1
        f32 = da[name].astype("<f4")[()]
        bits = x.view("<u2").astype(np.uint32) << 16
        if np.array_equal(np.asarray(f32, "<f4").reshape(-1).view("<u4"), bits):
            bf16_ok += 1
        else:
            bad.append(name + " (bf16 read-back)")
aa, ab = attrs(fa), attrs(fb)
adiff = sorted(k for k in set(aa) | set(ab)
               if k not in aa or k not in ab or np.asarray(aa[k]).tobytes() != np.asarray(ab[k]).tobytes())
print("datasets: %d (%d stored, %.1f MB), %d byte-identical, differing as expected: %s; bf16 datasets %d, read back "
      "through h5py as f32 exactly: %d; attributes differing: %d %s" % (len(da), stored, nbytes / 1e6, same,
      expected or "none", bf16, bf16_ok, len(adiff), adiff[:12]))
if bad:
    print("DIFFER:", bad[:20])
sys.exit(1 if bad or not da else 0)
EOF
        done
        echo "-- colossal-ckpt verify $n2 (b)"
        "${MPI[@]}" "$CKPT" verify "$b/checkpoints/$n2" 2>&1 | tail -3
        [ "${PIPESTATUS[0]}" = 0 ] || r2=1
        [ "$st" = "${STAGES%% *}" ] && { echo "-- colossal-ckpt inspect (zero $st, $n2)"; "${MPI[@]}" "$CKPT" inspect "$a/checkpoints/$n2" 2>&1 | head -60; }
        exit $((r1 | r2))
    ) >"$WORK/compare-$st.txt" 2>&1
    crc=$?
    cat "$WORK/compare-$st.txt" >>"$out/compare.txt"
    [ $crc = 0 ] || fails=$((fails + 1))
    note "zero $st: $([ $crc = 0 ] && echo BIT-EXACT || echo DIFFERENT)"
    grep -E "^(losses|datasets|DIFFER|-- step)" "$WORK/compare-$st.txt" | sed 's/^/  /' | tee -a "$summary"
    ls -l "$a/checkpoints/" "$b/checkpoints/" >>"$out/compare.txt" 2>&1
    # save and load times as printed (runs.log holds every run)
    awk -v st="$st" '/^=== zero/ { tag = $0; sub(/^=== /, "", tag); sub(/:.*/, "", tag) }
        /^checkpoint at step|resumed from/ && tag ~ ("^zero" st " ") { sub(/\/[^ ]*\/checkpoints\//, ""); print "  " tag ": " $0 }' \
        "$out/runs.log" | tee -a "$summary"
done
note "total $(elapsed) s; $([ $fails = 0 ] && echo PASS || echo "FAIL ($fails stage(s))")"
[ $fails = 0 ]
