# colossal-moe: pretraining of mixture-of-experts (Mixtral-style) models (docs/moe.md).
bin_PROGRAMS += apps/colossal-moe
apps_colossal_moe_SOURCES = apps/moe.c apps/pretrain.h apps/pretrain_data.c $(APP_COMMON_SOURCES) \
	$(TRAIN_COMMON_SOURCES)
apps_colossal_moe_LDADD = $(APP_LDADD) -lm

# End-to-end tests (shell, run under $(MPIEXEC)).
MOE_APP_TESTS = \
	tests/apps/moe_train.sh \
	tests/apps/moe_resume.sh
TESTS += $(MOE_APP_TESTS)
EXTRA_DIST += $(MOE_APP_TESTS) examples/moe-tiny.yaml
