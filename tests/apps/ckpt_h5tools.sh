#!/bin/sh
# A colossal-pretrain checkpoint read by the standard tools: h5ls lists
# every group with global shapes, h5dump shows the root attributes and the
# bf16 weights as numbers equal to the fp32 masters rounded to bf16, and
# (when the system Python has h5py) h5py reads the bf16 datasets exactly.
# Skipped (77) when h5ls/h5dump are not installed.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

command -v h5ls >/dev/null 2>&1 && command -v h5dump >/dev/null 2>&1 || {
    echo "SKIP: h5ls/h5dump not installed (hdf5-tools)"
    exit 77
}

# shellcheck disable=SC2086
run_np 2 $TINY --train.steps 3 --eval.interval 0 --log.interval 100 --checkpoint.every 3 \
    --model.param_dtype bf16 --run.dir "$TMP/run"
expect_ok
F="$TMP/run/checkpoints/step-00000003.h5"
[ -f "$F" ] || fail "no checkpoint $F"

h5ls -r "$F" >"$TMP/ls" 2>&1 || fail "h5ls failed on $F"
for g in model master optim/exp_avg optim/exp_avg_sq; do
    grep -q "^/$g/h.1.mlp.fc.weight  *Dataset {256, 64}" "$TMP/ls" || fail "h5ls does not list /$g/h.1.mlp.fc.weight {256, 64}"
    grep -q "^/$g/wte.weight  *Dataset {384, 64}" "$TMP/ls" || fail "h5ls does not list /$g/wte.weight {384, 64}"
    grep -q "^/$g/lm_head.weight" "$TMP/ls" && fail "the tied lm_head.weight is stored in /$g"
done
n=$(grep -v '^/storage' "$TMP/ls" | grep -c ' Dataset {[0-9]')
echo "h5ls: $n tensors"

h5dump -A -g / "$F" >"$TMP/attrs" 2>&1 || fail "h5dump -A failed"
for a in format step tokens consumed_samples data_seed rng.seed loss_scaler.scale layout.dp model.family \
    model.d_model optim.lr optim.schedule; do
    grep -q "ATTRIBUTE \"$a\"" "$TMP/attrs" || fail "h5dump shows no root attribute $a"
done
grep -A12 'ATTRIBUTE "format"' "$TMP/attrs" | grep -q '"colossal-checkpoint"' || fail "format attribute wrong"

# bf16 values as h5dump prints them vs the f32 masters rounded to bf16
# (round to nearest even on the bits).
d=h.0.mlp.fc.weight
h5dump -d "/model/$d" -s 0,0 -c 2,8 -m %.9g "$F" | awk '/DATA \{/ { on = 1; next } on && /\}/ { exit } on' |
    tr -s ' ,' '\n' |
    grep -E '^-?[0-9]' | grep -v ':$' >"$TMP/b16" || true
h5dump -d "/master/$d" -s 0,0 -c 2,8 -b LE -o "$TMP/m32.bin" "$F" >/dev/null || fail "h5dump -b failed"
od -An -tu4 -v "$TMP/m32.bin" | tr -s ' ' '\n' | grep -v '^$' | awk '{
    u = $1; lsb = int(u / 65536) % 2; r = int((u + 32767 + lsb) / 65536) * 65536
    sign = r >= 2147483648 ? -1 : 1; if (r >= 2147483648) r -= 2147483648
    e = int(r / 8388608); m = r % 8388608
    v = (e == 0) ? m / 8388608 * 2 ^ -126 : (1 + m / 8388608) * 2 ^ (e - 127)
    printf "%.9g\n", sign * v
}' >"$TMP/want"
[ "$(wc -l <"$TMP/b16")" -eq 16 ] || fail "h5dump printed $(wc -l <"$TMP/b16") bf16 values, expected 16"
paste "$TMP/b16" "$TMP/want" | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-9 * ($2 < 0 ? -$2 : $2)) { print; bad = 1 } }
    END { exit bad }' || fail "bf16 values in h5dump differ from the masters rounded to bf16"
echo "h5dump: 16 bf16 values of /model/$d equal the masters rounded to bf16"

PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
if "$PY" -c 'import h5py, numpy' 2>/dev/null; then
    "$PY" - "$F" <<'EOF' || fail "h5py check failed"
import sys
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
assert f.attrs["format"] == b"colossal-checkpoint", f.attrs["format"]
n = 0
for name, ds in f["model"].items():
    b = ds.astype("f4")[...]
    m = f["master"][name][...].astype(np.float32)
    u = m.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)
    assert b.shape == m.shape and np.array_equal(b, r), name
    n += 1
print("h5py: %d bf16 tensors equal the masters rounded to bf16" % n)
EOF
else
    echo "h5py not importable by $PY: skipping the h5py check"
fi
echo "PASS"
