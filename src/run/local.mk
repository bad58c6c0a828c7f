# run module: what every app's job needs (signals, device, memory plan,
# resume, the step loop with its checkpoint cadence, metrics.jsonl).
colossalinclude_HEADERS += src/include/colossal/run.h
src_libcolossal_core_la_SOURCES += \
	%reldir%/run_internal.h \
	%reldir%/signals.c \
	%reldir%/report.c \
	%reldir%/run.c

if HAVE_CHECK
# One program on 1 and 3 ranks (tests/run-mpi-test maps runN.npN to test_run).
check_PROGRAMS += tests/mpi/test_run
tests_mpi_test_run_SOURCES = tests/mpi/test_run.c tests/mpi/test_mesh_util.h
tests_mpi_test_run_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_run_LDADD = $(TEST_LIBS)
RUN_MPI_TESTS = tests/mpi/run1.np1 tests/mpi/run3.np3
$(RUN_MPI_TESTS):
	@$(MKDIR_P) $(@D) && : > $@
CLEANFILES += $(RUN_MPI_TESTS)
TESTS += $(RUN_MPI_TESTS)
endif
