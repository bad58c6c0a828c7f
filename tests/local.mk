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

# A full disk (tests/apps/disk_full.sh): the LD_PRELOAD shim that fills a
# directory after a byte budget (a shared object: -rpath makes libtool
# build one).
if HAVE_HDF5
check_LTLIBRARIES = tests/apps/libenospc_shim.la
tests_apps_libenospc_shim_la_SOURCES = tests/apps/enospc_shim.c
tests_apps_libenospc_shim_la_CFLAGS = $(WARN_CFLAGS)
tests_apps_libenospc_shim_la_LDFLAGS = -module -avoid-version -shared -rpath $(abs_builddir)
tests_apps_libenospc_shim_la_LIBADD = -ldl
TESTS += tests/apps/disk_full.sh
endif
EXTRA_DIST += tests/apps/disk_full.sh

# libFuzzer targets
include $(srcdir)/tests/fuzz/local.mk
