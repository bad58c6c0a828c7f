src_libcolossal_core_la_SOURCES += \
	%reldir%/status.c \
	%reldir%/log.c \
	%reldir%/memory.c \
	%reldir%/timer.c \
	%reldir%/rng.c \
	%reldir%/knobs.c
colossalinclude_HEADERS += src/include/colossal/base.h
