# colossal-sft: supervised fine-tuning on chat data (docs/sft.md).
bin_PROGRAMS += apps/colossal-sft
apps_colossal_sft_SOURCES = apps/sft.c apps/lora_app.c apps/lora_app.h $(APP_COMMON_SOURCES) $(TRAIN_COMMON_SOURCES)
apps_colossal_sft_LDADD = $(APP_LDADD)

# End-to-end tests (shell, run under $(MPIEXEC)).
SFT_APP_TESTS = \
	tests/apps/sft_e2e.sh \
	tests/apps/sft_errors.sh \
	tests/apps/sft_lora.sh \
	tests/apps/sft_parallel.sh \
	tests/apps/sft_tokens.sh
TESTS += $(SFT_APP_TESTS)
EXTRA_DIST += $(SFT_APP_TESTS) tests/apps/sft_lib.sh examples/sft-tiny.sh
