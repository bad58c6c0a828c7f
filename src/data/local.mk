# data module: tokenizer and dataset owners add sources here
colossalinclude_HEADERS += src/include/colossal/data.h
