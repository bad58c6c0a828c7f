# ops module: the op table and the CPU backend
src_libcolossal_core_la_SOURCES += \
	%reldir%/ops_internal.h \
	%reldir%/ops_check.c \
	%reldir%/cpu_internal.h \
	%reldir%/cpu_basic.c \
	%reldir%/cpu_matmul.c \
	%reldir%/cpu_norm.c \
	%reldir%/cpu_pointwise.c \
	%reldir%/cpu_attention.c \
	%reldir%/cpu_embed.c \
	%reldir%/cpu_optim.c \
	%reldir%/cpu_table.c
colossalinclude_HEADERS += src/include/colossal/ops.h
