# Apps and tools: each links libcolossal-core and stays short. app_common.c
# holds the shared start-up/failure code; it is compiled into each app rather
# than the library because it may call exit().
APP_COMMON_SOURCES = apps/app_common.c apps/app_common.h
APP_LDADD = src/libcolossal-core.la $(CORE_LIBS)
# The training engine colossal-pretrain and colossal-sft share.
TRAIN_COMMON_SOURCES = apps/train_common.c apps/train_common.h

bin_PROGRAMS += apps/colossal-check
apps_colossal_check_SOURCES = apps/check.c $(APP_COMMON_SOURCES)
apps_colossal_check_LDADD = $(APP_LDADD)

# End-to-end tests of colossal-check (shell, run under $(MPIEXEC)).
CHECK_APP_TESTS = \
	tests/apps/check_info.sh \
	tests/apps/check_layout.sh \
	tests/apps/check_layout_invalid.sh \
	tests/apps/check_bench.sh \
	tests/apps/check_cli.sh
TESTS += $(CHECK_APP_TESTS)
EXTRA_DIST += $(CHECK_APP_TESTS) tests/apps/check_lib.sh
include $(srcdir)/apps/data.mk
include $(srcdir)/apps/pretrain.mk
include $(srcdir)/apps/sft.mk
include $(srcdir)/apps/moe.mk
include $(srcdir)/apps/rlhf.mk
include $(srcdir)/apps/ckpt.mk
include $(srcdir)/apps/infer.mk
