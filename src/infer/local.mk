# infer module: sampling, batch-job lines, the paged KV cache, the
# continuous-batching scheduler and the engine
colossalinclude_HEADERS += src/include/colossal/infer.h
src_libcolossal_core_la_SOURCES += \
	%reldir%/sample.c \
	%reldir%/request.c \
	%reldir%/job_io.c \
	%reldir%/kv_cache.c \
	%reldir%/kv_cache.h \
	%reldir%/engine.c

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_sample tests/unit/test_job tests/unit/test_engine
tests_unit_test_engine_SOURCES = tests/unit/test_engine.c
tests_unit_test_engine_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_engine_LDADD = $(TEST_LIBS) -lm
tests_unit_test_sample_SOURCES = tests/unit/test_sample.c
tests_unit_test_sample_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_sample_LDADD = $(TEST_LIBS) -lm
tests_unit_test_job_SOURCES = tests/unit/test_job.c
tests_unit_test_job_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_job_LDADD = $(TEST_LIBS) $(JANSSON_LIBS)
TESTS += tests/unit/test_sample tests/unit/test_job tests/unit/test_engine
endif
