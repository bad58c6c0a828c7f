# ops module: the op table and the CPU backend
colossalinclude_HEADERS += src/include/colossal/ops.h
