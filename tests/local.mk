# Unit tests (Check, one process) and MPI tests (Check under mpiexec).
EXTRA_DIST += tests/run-mpi-test.in tests/suite-lock tests/mpi/test_wd_util.h
CLEANFILES += tests/suite.lock

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

# A full disk (tests/apps/disk_full.sh): the LD_PRELOAD shim that fills a
# directory after a byte budget. A plain shared object, not libtool's: the
# sanitizer build is configured --disable-shared.
if HAVE_HDF5
check_DATA = tests/apps/libenospc_shim.so
tests/apps/libenospc_shim.so: $(srcdir)/tests/apps/enospc_shim.c
	@$(MKDIR_P) $(@D)
	$(AM_V_CC)$(CC) -shared -fPIC -O1 $(WARN_CFLAGS) -o $@ $(srcdir)/tests/apps/enospc_shim.c -ldl
CLEANFILES += tests/apps/libenospc_shim.so
TESTS += tests/apps/disk_full.sh
# The chaos run (kill -9, SIGSTOP, SIGTERM/SIGUSR1, full disks through the
# shim, restarts with --resume auto); CAI_CHAOS_ROUNDS=N for a long one.
TESTS += tests/apps/pretrain_chaos.sh
endif
EXTRA_DIST += tests/apps/disk_full.sh tests/apps/enospc_shim.c tests/apps/pretrain_chaos.sh

# libFuzzer targets
include $(srcdir)/tests/fuzz/local.mk
