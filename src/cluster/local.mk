# cluster module: mesh, collectives (MPI and NCCL), watchdog, bandwidth bench
colossalinclude_HEADERS += src/include/colossal/cluster.h
src_libcolossal_core_la_SOURCES += \
	%reldir%/cluster_internal.h \
	%reldir%/layout.c \
	%reldir%/mesh.c \
	%reldir%/comm.c \
	%reldir%/watchdog.c \
	%reldir%/guard.c \
	%reldir%/shared_mem.c \
	%reldir%/nccl.c \
	%reldir%/bench.c

EXTRA_DIST += docs/cluster.md tests/mpi/watchdog_abort.sh tests/mpi/collectives-gpu-run.sh

# Abort-mode watchdog program driven by tests/mpi/watchdog_abort.sh (no Check).
check_PROGRAMS += tests/mpi/test_watchdog_abort
tests_mpi_test_watchdog_abort_SOURCES = tests/mpi/test_watchdog_abort.c
tests_mpi_test_watchdog_abort_LDADD = src/libcolossal-core.la
TESTS += tests/mpi/watchdog_abort.sh

# Device-buffer collectives (NCCL, staging), no Check so it also builds on GPU
# hosts without it; exits 77 (skipped) where no CUDA device is usable.
check_PROGRAMS += tests/mpi/test_collectives_gpu2
tests_mpi_test_collectives_gpu2_SOURCES = tests/mpi/test_collectives_gpu.c tests/mpi/test_collectives_ref.h
tests_mpi_test_collectives_gpu2_LDADD = src/libcolossal-core.la $(NCCL_LIBS) $(CUDA_LIBS)

# Markers are made in the build tree: tests/run-mpi-test looks for the
# program next to the marker, and a marker found in the source tree by VPATH
# (out-of-tree builds) would send it to the source directory.
CLUSTER_MPI_TESTS = tests/mpi/collectives_gpu2.np2

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_layout
tests_unit_test_layout_SOURCES = tests/unit/test_layout.c
tests_unit_test_layout_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_layout_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_layout

# One program per rank count: the test log is named after the marker minus
# its .npN extension, so mesh.np2 and mesh.np4 would share one log. The
# programs share their object file (no per-target flags; check.h needs none).
CLUSTER_MPI_PROGS = tests/mpi/test_mesh1 tests/mpi/test_mesh2 tests/mpi/test_mesh4 tests/mpi/test_mesh8 \
	tests/mpi/test_collectives1 tests/mpi/test_collectives3 tests/mpi/test_collectives4 \
	tests/mpi/test_collectives8 tests/mpi/test_watchdog4
check_PROGRAMS += $(CLUSTER_MPI_PROGS)
CLUSTER_MESH_SRC = tests/mpi/test_mesh.c tests/mpi/test_mesh_util.h
CLUSTER_COLL_SRC = tests/mpi/test_collectives.c tests/mpi/test_collectives_ref.h tests/mpi/test_mesh_util.h
tests_mpi_test_mesh1_SOURCES = $(CLUSTER_MESH_SRC)
tests_mpi_test_mesh2_SOURCES = $(CLUSTER_MESH_SRC)
tests_mpi_test_mesh4_SOURCES = $(CLUSTER_MESH_SRC)
tests_mpi_test_mesh8_SOURCES = $(CLUSTER_MESH_SRC)
tests_mpi_test_collectives1_SOURCES = $(CLUSTER_COLL_SRC)
tests_mpi_test_collectives3_SOURCES = $(CLUSTER_COLL_SRC)
tests_mpi_test_collectives4_SOURCES = $(CLUSTER_COLL_SRC)
tests_mpi_test_collectives8_SOURCES = $(CLUSTER_COLL_SRC)
tests_mpi_test_watchdog4_SOURCES = tests/mpi/test_watchdog.c tests/mpi/test_mesh_util.h
tests_mpi_test_mesh1_LDADD = $(TEST_LIBS)
tests_mpi_test_mesh2_LDADD = $(TEST_LIBS)
tests_mpi_test_mesh4_LDADD = $(TEST_LIBS)
tests_mpi_test_mesh8_LDADD = $(TEST_LIBS)
tests_mpi_test_collectives1_LDADD = $(TEST_LIBS)
tests_mpi_test_collectives3_LDADD = $(TEST_LIBS)
tests_mpi_test_collectives4_LDADD = $(TEST_LIBS)
tests_mpi_test_collectives8_LDADD = $(TEST_LIBS)
tests_mpi_test_watchdog4_LDADD = $(TEST_LIBS)

CLUSTER_MPI_TESTS += tests/mpi/mesh1.np1 tests/mpi/mesh2.np2 tests/mpi/mesh4.np4 tests/mpi/mesh8.np8 \
	tests/mpi/collectives1.np1 tests/mpi/collectives3.np3 tests/mpi/collectives4.np4 \
	tests/mpi/collectives8.np8 tests/mpi/watchdog4.np4
endif
$(CLUSTER_MPI_TESTS):
	@$(MKDIR_P) $(@D) && : > $@
CLEANFILES += $(CLUSTER_MPI_TESTS)
TESTS += $(CLUSTER_MPI_TESTS)
