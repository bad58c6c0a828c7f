# data module: tokenizer and dataset owners add sources here
colossalinclude_HEADERS += src/include/colossal/data.h

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
check_PROGRAMS += tests/unit/test_bpe
tests_unit_test_bpe_SOURCES = tests/unit/test_bpe.c
tests_unit_test_bpe_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_bpe_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_bpe
endif
# end tokenizer
