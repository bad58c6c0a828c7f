# parallel module: data parallelism (gradient all-reduce, replica check);
# tensor/pipeline/sequence/expert parallelism and ZeRO add their files here.
colossalinclude_HEADERS += src/include/colossal/parallel.h
src_libcolossal_core_la_SOURCES += %reldir%/dp.c %reldir%/moe_dispatch.c

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

# ---- expert parallelism (docs/moe.md): the MoE layer at ep = 2, 4 against ep = 1
if HAVE_CHECK
check_PROGRAMS += tests/mpi/test_moe
tests_mpi_test_moe_SOURCES = tests/mpi/test_moe.c tests/mpi/test_mesh_util.h tests/unit/moe_fixture.h
tests_mpi_test_moe_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_moe_LDADD = $(TEST_LIBS)
check_PROGRAMS += tests/mpi/test_moe_model
tests_mpi_test_moe_model_SOURCES = tests/mpi/test_moe_model.c tests/mpi/test_mesh_util.h
tests_mpi_test_moe_model_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_moe_model_LDADD = $(TEST_LIBS)
MOE_MPI_TESTS = tests/mpi/moe.np4 tests/mpi/moe_model.np4
$(MOE_MPI_TESTS):
	@$(MKDIR_P) $(@D) && : > $@
CLEANFILES += $(MOE_MPI_TESTS)
TESTS += $(MOE_MPI_TESTS)
endif

# ---- ZeRO / gradient buckets / loss scaling / memory planner (docs/parallel.md)
# The loss scaler lives in src/optim (the training step uses it); it is
# listed here with the engine it was written for.
src_libcolossal_core_la_SOURCES += \
	%reldir%/zero_internal.h \
	%reldir%/zero_layout.c \
	%reldir%/zero_comm.c \
	%reldir%/zero.c \
	%reldir%/planner.c \
	%reldir%/layout_plan.c \
	src/optim/loss_scale.c
EXTRA_DIST += docs/parallel.md tests/apps/pretrain_zero3.sh
TESTS += tests/apps/pretrain_zero3.sh

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_planner tests/mpi/test_zero tests/mpi/test_equiv tests/mpi/test_tp
tests_unit_test_planner_SOURCES = tests/unit/test_planner.c
tests_unit_test_planner_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_planner_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_planner
tests_mpi_test_zero_SOURCES = tests/mpi/test_zero.c tests/mpi/test_equiv_harness.h tests/mpi/test_mesh_util.h
tests_mpi_test_zero_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_zero_LDADD = $(TEST_LIBS)
tests_mpi_test_equiv_SOURCES = tests/mpi/test_equiv.c tests/mpi/test_equiv_harness.h tests/mpi/test_mesh_util.h
tests_mpi_test_equiv_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_equiv_LDADD = $(TEST_LIBS)
tests_mpi_test_tp_SOURCES = tests/mpi/test_tp.c tests/mpi/test_equiv_harness.h tests/mpi/test_mesh_util.h
tests_mpi_test_tp_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_tp_LDADD = $(TEST_LIBS)
ZERO_MPI_TESTS = tests/mpi/zero.np4 tests/mpi/equiv.np4 tests/mpi/tp.np4 tests/mpi/tp8.np8
$(ZERO_MPI_TESTS):
	@$(MKDIR_P) $(@D) && : > $@
CLEANFILES += $(ZERO_MPI_TESTS)
TESTS += $(ZERO_MPI_TESTS)
endif
# ---- end of ZeRO block

# ---- pipeline schedules as data (docs/pipeline.md): generators, the
# simulating checker, timeline and Chrome trace; colossal-check --schedule;
# the layout planner (layout_plan.c, above with the memory planner) and --plan.
colossalinclude_HEADERS += src/include/colossal/schedule.h
src_libcolossal_core_la_SOURCES += %reldir%/schedule.c %reldir%/pipeline.c
EXTRA_DIST += docs/pipeline.md tests/apps/check_schedule.sh tests/apps/pretrain_pp.sh tests/apps/check_plan.sh \
	tests/apps/pretrain_pp_equal.sh
TESTS += tests/apps/check_schedule.sh tests/apps/pretrain_pp.sh tests/apps/check_plan.sh tests/apps/pretrain_pp_equal.sh

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_schedule
tests_unit_test_schedule_SOURCES = tests/unit/test_schedule.c
tests_unit_test_schedule_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_schedule_LDADD = $(TEST_LIBS) $(JANSSON_LIBS)
TESTS += tests/unit/test_schedule
check_PROGRAMS += tests/mpi/test_pp
tests_mpi_test_pp_SOURCES = tests/mpi/test_pp.c tests/mpi/test_equiv_harness.h tests/mpi/test_mesh_util.h
tests_mpi_test_pp_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_pp_LDADD = $(TEST_LIBS)
PP_MPI_TESTS = tests/mpi/pp.np4 tests/mpi/pp8.np8
$(PP_MPI_TESTS):
	@$(MKDIR_P) $(@D) && : > $@
CLEANFILES += $(PP_MPI_TESTS)
TESTS += $(PP_MPI_TESTS)
endif

# ---- sequence-parallel attention (docs/sequence-parallel.md): ring
# attention (zigzag) and Ulysses over the sp axis
colossalinclude_HEADERS += src/include/colossal/seq_parallel.h
src_libcolossal_core_la_SOURCES += %reldir%/seq_parallel_internal.h %reldir%/seq_parallel.c \
	%reldir%/ring_attention.c %reldir%/ulysses.c
if HAVE_CHECK
check_PROGRAMS += tests/mpi/test_seq_parallel
tests_mpi_test_seq_parallel_SOURCES = tests/mpi/test_seq_parallel.c tests/mpi/test_mesh_util.h
tests_mpi_test_seq_parallel_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_seq_parallel_LDADD = $(TEST_LIBS)
SP_MPI_TESTS = tests/mpi/seq_parallel.np2 tests/mpi/seq_parallel4.np4
$(SP_MPI_TESTS):
	@$(MKDIR_P) $(@D) && : > $@
CLEANFILES += $(SP_MPI_TESTS)
TESTS += $(SP_MPI_TESTS)
endif
