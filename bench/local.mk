# Benchmarks: built by `make`, never run by `make check` (they take minutes).
# (bench/ is distributed whole: see EXTRA_DIST in Makefile.am.)
# bench/cpu_train.sh runs the colossal and PyTorch CPU training benchmarks
# side by side; results go to bench/RESULTS.md.
noinst_PROGRAMS = bench/cpu_train
bench_cpu_train_SOURCES = bench/cpu_train.c
bench_cpu_train_LDADD = src/libcolossal-core.la

# bench/offload_bench times the host side of a ZeRO offload step (AdamW on
# the flat shard, rounding to the working dtype) against a memcpy of the
# same bytes: `bench/offload_bench [N [threads...]]`.
noinst_PROGRAMS += bench/offload_bench
bench_offload_bench_SOURCES = bench/offload_bench.c
bench_offload_bench_LDADD = src/libcolossal-core.la

# bench/infer_bench: decode and prefill tokens/s of the inference engine on
# random weights (bench/infer_decode.sh runs it beside transformers'
# generate, bench/infer_prefill.sh beside transformers' forward).
noinst_PROGRAMS += bench/infer_bench
bench_infer_bench_SOURCES = bench/infer_bench.c
bench_infer_bench_LDADD = src/libcolossal-core.la
