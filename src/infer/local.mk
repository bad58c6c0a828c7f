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
# tp = 2 x dp = 2 and tp = 4 engines against one rank's
check_PROGRAMS += tests/mpi/test_infer
tests_mpi_test_infer_SOURCES = tests/mpi/test_infer.c tests/mpi/test_mesh_util.h
tests_mpi_test_infer_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_infer_LDADD = $(TEST_LIBS)
INFER_MPI_TESTS = tests/mpi/infer.np4
$(INFER_MPI_TESTS):
	@$(MKDIR_P) $(@D) && : > $@
CLEANFILES += $(INFER_MPI_TESTS)
TESTS += $(INFER_MPI_TESTS)
endif
