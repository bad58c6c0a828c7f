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
	%reldir%/hf_import.c %reldir%/hf_internal.h
if HAVE_CHECK
check_PROGRAMS += tests/unit/test_hf
tests_unit_test_hf_SOURCES = tests/unit/test_hf.c
tests_unit_test_hf_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_hf_LDADD = $(TEST_LIBS) $(JANSSON_LIBS)
TESTS += tests/unit/test_hf
endif
# driver of the PyTorch check (tests/apps/ckpt_hf_torch.sh): not a test by itself
check_PROGRAMS += tests/unit/test_hf_logits
tests_unit_test_hf_logits_SOURCES = tests/unit/test_hf_logits.c
tests_unit_test_hf_logits_LDADD = src/libcolossal-core.la
EXTRA_DIST += tests/parity/hf_reference.py
# end of hugging face
