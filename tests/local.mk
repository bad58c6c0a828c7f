# Unit tests (Check, one process) and MPI tests (Check under mpiexec).
EXTRA_DIST += tests/run-mpi-test.in tests/mpi/test_wd_util.h

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_base
tests_unit_test_base_SOURCES = tests/unit/test_base.c
tests_unit_test_base_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_base_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_base
endif
