# model module: parameter registry (layers and families are appended by their owners)
src_libcolossal_core_la_SOURCES += \
	%reldir%/registry.c \
	%reldir%/registry_init.c
colossalinclude_HEADERS += src/include/colossal/model.h

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_registry
tests_unit_test_registry_SOURCES = tests/unit/test_registry.c
tests_unit_test_registry_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_registry_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_registry
endif
