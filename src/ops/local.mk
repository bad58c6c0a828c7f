# ops module: the op table and the CPU backend
src_libcolossal_core_la_SOURCES += \
	%reldir%/ops_internal.h \
	%reldir%/ops_check.c \
	%reldir%/adamw_spans.c \
	%reldir%/cpu_internal.h \
	%reldir%/cpu_basic.c \
	%reldir%/cpu_kernels.c \
	%reldir%/cpu_matmul.c \
	%reldir%/cpu_norm.c \
	%reldir%/cpu_pointwise.c \
	%reldir%/cpu_attention.c \
	%reldir%/cpu_attn_merge.c \
	%reldir%/cpu_paged.c \
	%reldir%/cpu_moe.c \
	%reldir%/cpu_moe_route.c \
	%reldir%/moe_route_math.h \
	%reldir%/cpu_embed.c \
	%reldir%/cpu_optim.c \
	%reldir%/ops_fp8.c \
	%reldir%/cpu_fp8.c \
	%reldir%/cpu_table.c
colossalinclude_HEADERS += src/include/colossal/ops.h

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_ops tests/unit/test_ops_attention tests/unit/test_ops_moe
tests_unit_test_ops_SOURCES = tests/unit/test_ops.c tests/unit/test_ops_util.h
tests_unit_test_ops_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_ops_LDADD = $(TEST_LIBS)
tests_unit_test_ops_attention_SOURCES = tests/unit/test_ops_attention.c tests/unit/test_ops_util.h
tests_unit_test_ops_attention_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_ops_attention_LDADD = $(TEST_LIBS)
tests_unit_test_ops_moe_SOURCES = tests/unit/test_ops_moe.c tests/unit/test_ops_util.h
tests_unit_test_ops_moe_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_ops_moe_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_ops tests/unit/test_ops_attention tests/unit/test_ops_moe
endif
