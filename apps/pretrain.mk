# colossal-pretrain: data- and tensor-parallel pretraining of GPT-2 / Llama models.
bin_PROGRAMS += apps/colossal-pretrain
apps_colossal_pretrain_SOURCES = apps/pretrain.c apps/pretrain.h apps/pretrain_data.c \
	apps/pretrain_generate.c $(APP_COMMON_SOURCES) $(TRAIN_COMMON_SOURCES)
apps_colossal_pretrain_LDADD = $(APP_LDADD) -lm

# End-to-end tests (shell, run under $(MPIEXEC)).
PRETRAIN_APP_TESTS = \
	tests/apps/pretrain_loss.sh \
	tests/apps/pretrain_fp8.sh \
	tests/apps/pretrain_dp_equiv.sh \
	tests/apps/pretrain_tp.sh \
	tests/apps/pretrain_sp.sh \
	tests/apps/pretrain_signal.sh \
	tests/apps/pretrain_stall.sh \
	tests/apps/plot_metrics_errors.sh \
	tests/apps/pretrain_errors.sh \
	tests/apps/pretrain_examples.sh
TESTS += $(PRETRAIN_APP_TESTS)
EXTRA_DIST += $(PRETRAIN_APP_TESTS) tests/apps/pretrain_lib.sh tests/apps/launch_lib.sh
