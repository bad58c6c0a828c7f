# optim module: AdamW over the flat parameter layout, LR schedules, clipping, the training step
colossalinclude_HEADERS += src/include/colossal/optim.h
src_libcolossal_core_la_SOURCES += \
	%reldir%/adamw.c \
	%reldir%/train.c \
	%reldir%/lora_driver.c \
	%reldir%/moe_driver.c
