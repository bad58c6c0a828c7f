# colossal-infer: batch inference (JSONL in, JSONL out) and log-likelihood evaluation.
bin_PROGRAMS += apps/colossal-infer
apps_colossal_infer_SOURCES = apps/infer.c apps/infer.h apps/infer_io.c apps/infer_score.c $(APP_COMMON_SOURCES)
apps_colossal_infer_LDADD = $(APP_LDADD) -lm

# End-to-end tests (shell, run under $(MPIEXEC)).
INFER_APP_TESTS = \
	tests/apps/infer_generate.sh \
	tests/apps/infer_resume.sh \
	tests/apps/infer_errors.sh \
	tests/apps/infer_score.sh \
	tests/apps/infer_examples.sh
TESTS += $(INFER_APP_TESTS)
EXTRA_DIST += $(INFER_APP_TESTS) tests/apps/infer_lib.sh
