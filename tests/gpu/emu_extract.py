"""Source extraction for the CPU emulations of the CUDA kernels
(tests/gpu/embed_emu.sh, tests/gpu/normxent_emu.sh): the emulators compile
the kernels' own text, cut out of kernels/*.cu between marker comments, so
a kernel change is tested without copying it."""


def cut(text, start, stop):
    """text from the marker `start` up to (not including) the next `stop`."""
    a = text.index(start)
    return text[a:text.index(stop, a)]


def common_parts(top):
    """The number formats and the 16-byte vector helpers of cuda_common.cuh."""
    common = open(top + "/kernels/cuda_common.cuh").read()
    return [
        cut(common, "/* ---------------------------------------------------------------- number formats */",
            "/* ---------------------------------------------------------------- Philox"),
        cut(common, "template <int DT> CUK_INLINE float cuk_ld1", "static inline int cuk_dt_size"),
    ]


def write(out, parts, subs):
    """Join the parts, apply the (old, new) substitutions (each must match), write out/kern.inc."""
    src = "\n".join(parts)
    for a, b in subs:
        assert a in src, a
        src = src.replace(a, b)
    open(out + "/kern.inc", "w").write(src)
