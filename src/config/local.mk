# config module: YAML file + CLI overrides -> typed structs (libyaml).
colossalinclude_HEADERS += src/include/colossal/config.h
src_libcolossal_core_la_SOURCES += \
	%reldir%/config_internal.h \
	%reldir%/config.c \
	%reldir%/config_yaml.c \
	%reldir%/config_args.c

EXTRA_DIST += \
	tests/data/config/good.yaml \
	tests/data/config/unknown_key.yaml \
	tests/data/config/bad_type.yaml \
	tests/data/config/out_of_range.yaml \
	tests/data/config/bad_enum.yaml \
	tests/data/config/bad_syntax.yaml \
	tests/data/config/duplicate_key.yaml \
	tests/data/config/sequence.yaml

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_config
tests_unit_test_config_SOURCES = tests/unit/test_config.c
tests_unit_test_config_CPPFLAGS = $(AM_CPPFLAGS) -DCAI_CONFIG_TEST_DATA='"$(abs_top_srcdir)/tests/data/config"'
tests_unit_test_config_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_config_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_config
endif
