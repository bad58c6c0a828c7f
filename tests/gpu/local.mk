# GPU tests (docs/cuda.md): every CUDA op against the CPU backend. Built with
# the CUDA backend; without a visible GPU the test exits 77 (skipped), so
# CPU-only machines and CI pass. bench_cuda_ops times the ops (not a test).
if HAVE_CUDA
check_PROGRAMS += tests/gpu/test_cuda_ops tests/gpu/bench_cuda_ops
tests_gpu_test_cuda_ops_SOURCES = tests/gpu/test_cuda_ops.c tests/gpu/gpu_test_util.h
tests_gpu_test_cuda_ops_LDADD = src/libcolossal-core.la
tests_gpu_bench_cuda_ops_SOURCES = tests/gpu/bench_cuda_ops.c tests/gpu/gpu_test_util.h
tests_gpu_bench_cuda_ops_LDADD = src/libcolossal-core.la
TESTS += tests/gpu/test_cuda_ops
endif
EXTRA_DIST += tests/gpu/torch_ref.py tests/gpu/device-run.sh
