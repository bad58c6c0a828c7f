# libFuzzer targets (tests/fuzz/README.md). build.sh compiles the library's
# sources and the targets with $(FUZZ_CC) -fsanitize=fuzzer,address,undefined
# into tests/fuzz/bin/ (apart from the mpicc-built library); each
# tests/fuzz/NAME.fuzz marker runs tests/fuzz/run.sh: the regression inputs
# of NAME, then a few seconds of fuzzing from the seed corpus. Without clang
# and libFuzzer (configure's HAVE_FUZZ) the markers SKIP.
# Spelled out: automake reads TESTS itself and cannot expand $(VAR:%=...).
FUZZ_MARKERS = tests/fuzz/safetensors.fuzz tests/fuzz/hf_config.fuzz tests/fuzz/ckpt_h5.fuzz tests/fuzz/indexed.fuzz \
	tests/fuzz/config_yaml.fuzz tests/fuzz/config_args.fuzz tests/fuzz/bpe_files.fuzz tests/fuzz/bpe_hf.fuzz \
	tests/fuzz/bpe_encode.fuzz tests/fuzz/job_lines.fuzz tests/fuzz/chat_lines.fuzz
TEST_EXTENSIONS += .fuzz
FUZZ_LOG_COMPILER = $(SUITE_SHARED) $(SHELL) $(top_srcdir)/tests/fuzz/run.sh
TESTS += $(FUZZ_MARKERS)
EXTRA_DIST += tests/fuzz
CLEANFILES += $(FUZZ_MARKERS)

$(FUZZ_MARKERS): tests/fuzz/.build
	@$(MKDIR_P) $(@D) && : > $@

.PHONY: tests/fuzz/.build
tests/fuzz/.build:
if HAVE_FUZZ
	@FUZZ_CC="$(FUZZ_CC)" FUZZ_JOBS=2 \
	FUZZ_DEP_CFLAGS="$(BLAS_CFLAGS) $(YAML_CFLAGS) $(JANSSON_CFLAGS) $(HDF5_CFLAGS)" \
	FUZZ_DEP_LIBS="$(HDF5_LIBS) $(YAML_LIBS) $(JANSSON_LIBS) $(BLAS_LIBS) $(LIBS)" \
	$(SHELL) $(top_srcdir)/tests/fuzz/build.sh $(top_srcdir) $(top_builddir) tests/fuzz
else
	@:
endif

clean-local: clean-fuzz
clean-fuzz:
	rm -rf tests/fuzz/bin tests/fuzz/obj tests/fuzz/include tests/fuzz/libfuzzcore.a tests/fuzz/sources.txt tests/fuzz/.headers
.PHONY: clean-fuzz
