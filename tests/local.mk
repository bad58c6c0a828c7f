# Unit tests (Check, one process) and MPI tests (Check under mpiexec).
EXTRA_DIST += tests/run-mpi-test.in tests/mpi/test_wd_util.h

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_base
tests_unit_test_base_SOURCES = tests/unit/test_base.c
tests_unit_test_base_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_base_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_base
check_PROGRAMS += tests/unit/test_knobs
tests_unit_test_knobs_SOURCES = tests/unit/test_knobs.c
tests_unit_test_knobs_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_knobs_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_knobs
endif
