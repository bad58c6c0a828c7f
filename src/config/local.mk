# config module: sources added by its owner
colossalinclude_HEADERS += src/include/colossal/config.h
