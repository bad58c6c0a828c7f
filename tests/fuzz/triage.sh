#!/bin/sh
# Whose bug a fuzz target's crash log shows (tests/fuzz/README.md):
#   triage.sh SRCDIR LOG
# prints one line, "libhdf5 FRAME" or "colossal FRAME" (FRAME: the frame
# that decided it), or "none" when LOG holds no report.
#
# libhdf5: the first frame of the crash stack that is either libhdf5's or
# colossal's (compiled from SRCDIR/src or SRCDIR/tests/fuzz) is libhdf5's,
# and so is the direct caller of every allocation and free ASan names
# (fuzz_ckpt_h5 keeps two frames of those), so the memory involved is
# HDF5's own. A timeout or an out-of-memory is libhdf5's by the same rule
# on the stack libFuzzer prints (the loop, or the caller of the oversized
# malloc, past libFuzzer's and the sanitizer's own frames). Everything else
# is colossal's to look at: a leak (HDF5's own are suppressed), a UBSan
# report (only colossal is instrumented), a crash on memory colossal
# allocated or freed, or a stack that names neither. Frames of the target
# binary count as colossal's only when symbolized to SRCDIR's sources.
srcdir=$1
log=$2
awk -v src="$srcdir/src/" -v fz="$srcdir/tests/fuzz/" '
# a source location under src/ or tests/fuzz/ (not the path of the binary,
# which may lie under tests/fuzz/ too)
function ours(line, dir,    p) {
    p = index(line, dir)
    return p && substr(line, p + length(dir)) ~ /^[^ ()]*\.[ch]:[0-9]/
}
function cls(line) {
    if (index(line, "libhdf5")) return "libhdf5"
    if (ours(line, src) || ours(line, fz)) return "colossal"
    return ""
}
function frame(line) {
    sub(/^ *#[0-9]+ 0x[0-9a-f]+ /, "", line)
    sub(/ \(BuildId: [0-9a-f]+\)$/, "", line)
    return line
}
/LeakSanitizer: detected memory leaks/ { verdict = "colossal leak"; exit }
/runtime error:/ { verdict = "colossal UBSan: " $0; exit }
/ERROR: libFuzzer: (timeout|out-of-memory)/ { inreport = 1; stack = "crash"; what = $0; sub(/^.*ERROR: libFuzzer: /, "", what); next }
/ERROR: AddressSanitizer:|ERROR: libFuzzer: deadly signal/ { inreport = 1; stack = "crash"; next }
!inreport { next }
/^(freed by thread|previously allocated by thread|allocated by thread)/ { stack = "mem"; seen[stack] = 0; next }
/^SUMMARY:/ { inreport = 0; next }
/^ *#[0-9]+ / {
    c = cls($0)
    if (c == "" || seen[stack]) next
    seen[stack] = 1
    if (stack == "crash") { crash = c; crashframe = frame($0) }
    else if (c == "colossal") { memours = frame($0) }
}
END {
    if (verdict != "") { print verdict; exit }
    if (what != "") { print (crash == "libhdf5" ? "libhdf5 " : "colossal ") what (crash == "" ? "" : " at " crashframe); exit }
    if (crash == "") { print (stack == "" ? "none" : "colossal (no libhdf5 or colossal frame)"); exit }
    if (crash == "libhdf5" && memours == "") print "libhdf5 " crashframe
    else if (crash == "libhdf5") print "colossal memory: " memours
    else print "colossal " crashframe
}' "$log"
