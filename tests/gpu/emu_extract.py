"""Source extraction for the CPU emulations of the CUDA kernels
(tests/gpu/*_emu.sh): the emulators compile the kernels' own text, so a
kernel change is tested without copying it. The text is cut out of
kernels/*.cu and cuda_common.cuh between the code markers
CUK_EMU_BEGIN(name); and CUK_EMU_END(name); (cuda_common.cuh), which the
compiler checks in both builds; comments play no part."""

import re


def region(text, name):
    """The lines from CUK_EMU_BEGIN(name); through CUK_EMU_END(name); (both
    markers included: the emulator compiles them too). Each marker must occur
    exactly once, BEGIN first."""
    marks = {}
    for kind in ("BEGIN", "END"):
        found = [m.start() for m in re.finditer(r"^CUK_EMU_%s\(%s\);[ \t]*$" % (kind, re.escape(name)), text, re.M)]
        if len(found) != 1:
            raise SystemExit("emu_extract: CUK_EMU_%s(%s); occurs %d times (want once)" % (kind, name, len(found)))
        marks[kind] = found[0]
    if marks["END"] < marks["BEGIN"]:
        raise SystemExit("emu_extract: CUK_EMU_END(%s); comes before its BEGIN" % name)
    return text[marks["BEGIN"]:text.index("\n", marks["END"]) + 1]


def source(top, path):
    with open(top + "/" + path) as f:
        return f.read()


def common_parts(top):
    """The number formats and the 16-byte vector helpers of cuda_common.cuh."""
    common = source(top, "kernels/cuda_common.cuh")
    return [region(common, "cuk_formats"), region(common, "cuk_vec")]


def write(out, parts, subs):
    """Join the parts, apply the (old, new) substitutions (each must match:
    they turn shared-memory declarations and inline PTX into the emulated
    block's storage and host code), write out/kern.inc."""
    src = "\n".join(parts)
    for a, b in subs:
        if a not in src:
            raise SystemExit("emu_extract: the kernel source no longer contains: " + a)
        src = src.replace(a, b)
    with open(out + "/kern.inc", "w") as f:
        f.write(src)
