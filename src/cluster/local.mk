# cluster module: sources added by its owner
colossalinclude_HEADERS += src/include/colossal/cluster.h
