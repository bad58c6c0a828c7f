# ckpt module: safetensors (parallel HDF5 checkpoints are appended by their owner)
src_libcolossal_core_la_SOURCES += %reldir%/safetensors.c
colossalinclude_HEADERS += src/include/colossal/ckpt.h
EXTRA_DIST += tests/data/safetensors/reference.py tests/data/safetensors/torch_written.safetensors

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_safetensors
tests_unit_test_safetensors_SOURCES = tests/unit/test_safetensors.c
tests_unit_test_safetensors_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_safetensors_LDADD = $(TEST_LIBS) $(JANSSON_LIBS)
TESTS += tests/unit/test_safetensors
endif

# hugging face: safetensors export/import with HF names, layouts and config.json
src_libcolossal_core_la_SOURCES += %reldir%/hf_map.c %reldir%/hf_config.c %reldir%/hf_export.c \
	%reldir%/hf_import.c %reldir%/hf_internal.h %reldir%/lora_io.c
if HAVE_CHECK
check_PROGRAMS += tests/unit/test_hf
tests_unit_test_hf_SOURCES = tests/unit/test_hf.c tests/unit/test_hf_util.h
tests_unit_test_hf_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_hf_LDADD = $(TEST_LIBS) $(JANSSON_LIBS)
TESTS += tests/unit/test_hf
check_PROGRAMS += tests/unit/test_hf_mixtral
tests_unit_test_hf_mixtral_SOURCES = tests/unit/test_hf_mixtral.c tests/unit/test_hf_util.h
tests_unit_test_hf_mixtral_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_hf_mixtral_LDADD = $(TEST_LIBS) $(JANSSON_LIBS)
TESTS += tests/unit/test_hf_mixtral
endif
# driver of the PyTorch check (tests/apps/ckpt_hf_torch.sh): not a test by itself
check_PROGRAMS += tests/unit/test_hf_logits
tests_unit_test_hf_logits_SOURCES = tests/unit/test_hf_logits.c
tests_unit_test_hf_logits_LDADD = src/libcolossal-core.la
EXTRA_DIST += tests/parity/hf_reference.py
# end of hugging face

# hdf5 checkpoint ---------------------------------------------------------
# Parallel HDF5 checkpoints (docs/checkpoint.md). The sources build to
# CAI_ERR_UNSUPPORTED stubs when configure found no parallel HDF5.
src_libcolossal_core_la_SOURCES += \
	%reldir%/checkpoint_internal.h \
	%reldir%/checkpoint_plan.c \
	%reldir%/checkpoint_xfer.c \
	%reldir%/checkpoint.c \
	%reldir%/checkpoint_dir.c \
	%reldir%/checkpoint_file.c \
	%reldir%/checkpoint_zero.c \
	%reldir%/h5io.c
EXTRA_DIST += docs/checkpoint.md

# Checkpoint bandwidth vs the raw disk (bench/ckpt_bench.sh; takes minutes,
# so it is built with the tests but never run by them).
check_PROGRAMS += bench/ckpt_bench
bench_ckpt_bench_SOURCES = bench/ckpt_bench.c
bench_ckpt_bench_LDADD = src/libcolossal-core.la -lm

# End-to-end tests through colossal-pretrain (shell, run under $(MPIEXEC)).
CKPT_APP_TESTS = tests/apps/ckpt_resume.sh tests/apps/ckpt_crash.sh tests/apps/ckpt_h5tools.sh \
	tests/apps/ckpt_reshard_zero.sh
if HAVE_HDF5
TESTS += $(CKPT_APP_TESTS)
endif
EXTRA_DIST += $(CKPT_APP_TESTS)

if HAVE_CHECK
# One program, run on 1, 2 and 4 ranks (tests/run-mpi-test maps ckptN.npN to
# test_ckpt; the rank count in the marker keeps the logs apart). Markers are
# made in the build tree.
check_PROGRAMS += tests/mpi/test_ckpt
tests_mpi_test_ckpt_SOURCES = tests/mpi/test_ckpt.c tests/mpi/test_mesh_util.h
tests_mpi_test_ckpt_CFLAGS = $(TEST_CFLAGS)
tests_mpi_test_ckpt_LDADD = $(TEST_LIBS) $(HDF5_LIBS)
CKPT_MPI_TESTS = tests/mpi/ckpt1.np1 tests/mpi/ckpt2.np2 tests/mpi/ckpt4.np4
$(CKPT_MPI_TESTS):
	@$(MKDIR_P) $(@D) && : > $@
CLEANFILES += $(CKPT_MPI_TESTS)
TESTS += $(CKPT_MPI_TESTS)
endif
# end of hdf5 checkpoint --------------------------------------------------
