# GPU tests (docs/cuda.md): every CUDA op against the CPU backend, and
# training on a GPU through the ZeRO engine without device allocations after
# the first step. Built with the CUDA backend; without a visible GPU the tests
# exit 77 (skipped), so CPU-only machines and CI pass. bench_cuda_ops times
# the ops (not a test). model-run.sh runs the whole-model tests on a GPU
# machine (docs/cuda.md "Whole-model tests").
if HAVE_CUDA
check_PROGRAMS += tests/gpu/test_cuda_ops tests/gpu/bench_cuda_ops tests/gpu/test_gpu_train
tests_gpu_test_cuda_ops_SOURCES = tests/gpu/test_cuda_ops.c tests/gpu/gpu_test_util.h
tests_gpu_test_cuda_ops_LDADD = src/libcolossal-core.la
tests_gpu_test_cuda_ops_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/kernels
tests_gpu_bench_cuda_ops_SOURCES = tests/gpu/bench_cuda_ops.c tests/gpu/gpu_test_util.h
tests_gpu_bench_cuda_ops_LDADD = src/libcolossal-core.la
tests_gpu_bench_cuda_ops_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/kernels
tests_gpu_test_gpu_train_SOURCES = tests/gpu/test_gpu_train.c
tests_gpu_test_gpu_train_LDADD = src/libcolossal-core.la
TESTS += tests/gpu/test_cuda_ops tests/gpu/test_gpu_train
check_PROGRAMS += tests/gpu/test_cuda_fp8
tests_gpu_test_cuda_fp8_SOURCES = tests/gpu/test_cuda_fp8.c
tests_gpu_test_cuda_fp8_LDADD = src/libcolossal-core.la
TESTS += tests/gpu/test_cuda_fp8
endif
# The CPU emulations of the CUDA kernels (tests/gpu/*_emu.sh: the kernels'
# own source, cut out between CUK_EMU_BEGIN/END markers, compiled by g++ and
# checked against double-precision references) need neither a GPU nor nvcc:
# they run in every build. `make check-emu` runs just them (nothing to build).
GPU_EMU_TESTS = tests/gpu/flash_emu.sh tests/gpu/normxent_emu.sh tests/gpu/embed_emu.sh tests/gpu/moe_emu.sh \
	tests/gpu/paged_emu.sh tests/gpu/gemv_emu.sh
TESTS += $(GPU_EMU_TESTS)
check-emu:
	$(MAKE) $(AM_MAKEFLAGS) check-TESTS TESTS='$(GPU_EMU_TESTS)'
.PHONY: check-emu

EXTRA_DIST += tests/gpu/torch_ref.py tests/gpu/device-run.sh tests/gpu/model-run.sh tests/gpu/sp-run.sh tests/gpu/model_parity.py \
	tests/gpu/run-all.sh tests/gpu/snapshot.sh tests/gpu/hf-prepare.sh tests/gpu/hf_transformers.py \
	tests/gpu/flash_emu.sh tests/gpu/flash_emu.cpp tests/gpu/normxent_emu.sh tests/gpu/normxent_emu.cpp \
	tests/gpu/embed_emu.sh tests/gpu/embed_emu.cpp tests/gpu/emu_cuda.h tests/gpu/emu_extract.py tests/gpu/emu_common.sh \
	tests/gpu/moe_emu.sh tests/gpu/moe_emu.cpp tests/gpu/paged_emu.sh tests/gpu/paged_emu.cpp tests/gpu/emu_mma.h \
	tests/gpu/gemv_emu.sh tests/gpu/gemv_emu.cpp \
	tests/gpu/infer-run.sh tests/gpu/infer-prepare.sh tests/gpu/peft-prepare.sh tests/gpu/peft_check.py \
	tests/gpu/sft-tokens-prepare.sh tests/gpu/mixtral-prepare.sh tests/gpu/mixtral_check.py
