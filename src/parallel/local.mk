# parallel module: data parallelism (gradient all-reduce, replica check);
# tensor/pipeline/sequence/expert parallelism and ZeRO add their files here.
colossalinclude_HEADERS += src/include/colossal/parallel.h
src_libcolossal_core_la_SOURCES += %reldir%/dp.c

if HAVE_CHECK
check_PROGRAMS += tests/mpi/test_dp
tests_mpi_test_dp_SOURCES = tests/mpi/test_dp.c tests/mpi/test_mesh_util.h
tests_mpi_test_dp_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_dp_LDADD = $(TEST_LIBS)
# The marker is made in the build tree (see src/cluster/local.mk for why).
PARALLEL_MPI_TESTS = tests/mpi/dp.np3
$(PARALLEL_MPI_TESTS):
	@$(MKDIR_P) $(@D) && : > $@
CLEANFILES += $(PARALLEL_MPI_TESTS)
TESTS += $(PARALLEL_MPI_TESTS)
endif
