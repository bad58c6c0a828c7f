# tensor module: dtypes and conversions, devices, tensor views
src_libcolossal_core_la_SOURCES += \
	%reldir%/convert.c \
	%reldir%/device.c \
	%reldir%/fp8.c \
	%reldir%/tensor.c
colossalinclude_HEADERS += src/include/colossal/tensor.h

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_tensor
tests_unit_test_tensor_SOURCES = tests/unit/test_tensor.c tests/unit/test_ops_util.h
tests_unit_test_tensor_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_tensor_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_tensor
check_PROGRAMS += tests/unit/test_fp8
tests_unit_test_fp8_SOURCES = tests/unit/test_fp8.c tests/unit/test_ops_util.h
tests_unit_test_fp8_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_fp8_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_fp8
endif
