# data module: tokenizer and dataset owners add sources here
colossalinclude_HEADERS += src/include/colossal/data.h

# datasets: Megatron indexed datasets, preprocessing, GPT sampling/blending, sampler, corpus
src_libcolossal_core_la_SOURCES += \
	%reldir%/indexed.c \
	%reldir%/indexed_preprocess.c \
	%reldir%/sampler.c \
	%reldir%/sampler_gpt.c \
	%reldir%/corpus.c \
	%reldir%/preprocess_internal.h \
	%reldir%/chat.c \
	%reldir%/sft.c \
	%reldir%/sft_data.c
EXTRA_DIST += docs/data.md docs/sft.md

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_indexed tests/unit/test_sampler tests/mpi/test_preprocess tests/unit/test_sft
tests_unit_test_sft_SOURCES = tests/unit/test_sft.c tests/unit/test_indexed_util.h
tests_unit_test_sft_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_sft_LDADD = $(TEST_LIBS)
tests_unit_test_indexed_SOURCES = tests/unit/test_indexed.c tests/unit/test_indexed_util.h
tests_unit_test_indexed_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_indexed_LDADD = $(TEST_LIBS) $(JANSSON_LIBS)
tests_unit_test_sampler_SOURCES = tests/unit/test_sampler.c tests/unit/test_indexed_util.h
tests_unit_test_sampler_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_sampler_LDADD = $(TEST_LIBS)
tests_mpi_test_preprocess_SOURCES = tests/mpi/test_preprocess.c tests/unit/test_indexed_util.h
tests_mpi_test_preprocess_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_preprocess_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_indexed tests/unit/test_sampler tests/unit/test_sft
# The marker is made in the build tree (see src/cluster/local.mk for why).
DATA_MPI_TESTS = tests/mpi/preprocess.np3
$(DATA_MPI_TESTS):
	@$(MKDIR_P) $(@D) && : > $@
CLEANFILES += $(DATA_MPI_TESTS)
TESTS += $(DATA_MPI_TESTS)
endif

# tokenizer
src_libcolossal_core_la_SOURCES += \
	%reldir%/bpe.c \
	%reldir%/bpe_io.c \
	%reldir%/bpe_train.c \
	%reldir%/bpe_util.c \
	%reldir%/bpe_unicode.c \
	%reldir%/bpe_internal.h
EXTRA_DIST += %reldir%/gen_bpe_unicode.py \
	tests/data/bpe/fetch-gpt2-vocab.sh \
	tests/data/bpe/ref_encode.py \
	tests/data/bpe/tiny_tokenizer.json
if HAVE_CHECK
check_PROGRAMS += tests/unit/test_bpe tests/unit/test_bpe_gpt2
tests_unit_test_bpe_SOURCES = tests/unit/test_bpe.c
tests_unit_test_bpe_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_bpe_LDADD = $(TEST_LIBS)
tests_unit_test_bpe_gpt2_SOURCES = tests/unit/test_bpe_gpt2.c
tests_unit_test_bpe_gpt2_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_bpe_gpt2_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_bpe tests/unit/test_bpe_gpt2
endif
# Benchmark (bench/RESULTS.md): a check program so that `make check` keeps it
# compiling; it is not in TESTS. Run: bench/tokenizer_bench --help.
check_PROGRAMS += bench/tokenizer_bench
bench_tokenizer_bench_SOURCES = bench/tokenizer_bench.c
bench_tokenizer_bench_LDADD = src/libcolossal-core.la
# end tokenizer
