# colossal-rlhf: reward models, DPO/SimPO, GRPO and PPO (docs/rlhf.md).
bin_PROGRAMS += apps/colossal-rlhf
apps_colossal_rlhf_SOURCES = apps/rlhf.c apps/rlhf_algo.c apps/rlhf.h $(APP_COMMON_SOURCES) $(TRAIN_COMMON_SOURCES)
apps_colossal_rlhf_LDADD = $(APP_LDADD) -lm

# End-to-end tests (shell, run under $(MPIEXEC)).
RLHF_APP_TESTS = tests/apps/rlhf_e2e.sh
TESTS += $(RLHF_APP_TESTS)
EXTRA_DIST += $(RLHF_APP_TESTS) examples/rlhf-tiny.sh
