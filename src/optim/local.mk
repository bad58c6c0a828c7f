# optim module: AdamW over the flat parameter layout, LR schedules, clipping, the training step
colossalinclude_HEADERS += src/include/colossal/optim.h
