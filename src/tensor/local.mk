# tensor module: dtypes and conversions, devices, tensor views
colossalinclude_HEADERS += src/include/colossal/tensor.h
