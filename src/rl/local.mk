# rl module: the alignment objectives (objectives.c), the scalar head
# (head.c), preference and prompt data with the verifiable rewards
# (rl_data.c, rewards.c)
colossalinclude_HEADERS += src/include/colossal/rl.h
src_libcolossal_core_la_SOURCES += \
	%reldir%/objectives.c \
	%reldir%/head.c \
	%reldir%/rl_data.c \
	%reldir%/rewards.c

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_rl tests/unit/test_rl_data
tests_unit_test_rl_SOURCES = tests/unit/test_rl.c
tests_unit_test_rl_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_rl_LDADD = $(TEST_LIBS) -lm
tests_unit_test_rl_data_SOURCES = tests/unit/test_rl_data.c
tests_unit_test_rl_data_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_rl_data_LDADD = $(TEST_LIBS) -lm
TESTS += tests/unit/test_rl tests/unit/test_rl_data
endif
