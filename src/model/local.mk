# model module: parameter registry, layers, GPT-2 / Llama families
src_libcolossal_core_la_SOURCES += \
	%reldir%/registry.c \
	%reldir%/registry_init.c \
	%reldir%/layers.c \
	%reldir%/model.c \
	%reldir%/model_internal.h \
	%reldir%/weights.c \
	%reldir%/lora.c \
	%reldir%/fp8.c \
	%reldir%/moe.c \
	%reldir%/model_moe.c
colossalinclude_HEADERS += src/include/colossal/model.h src/include/colossal/moe.h src/include/colossal/lora.h src/include/colossal/fp8.h

if HAVE_CHECK
check_PROGRAMS += tests/unit/test_registry
tests_unit_test_registry_SOURCES = tests/unit/test_registry.c
tests_unit_test_registry_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_registry_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_registry

check_PROGRAMS += tests/unit/test_layers tests/unit/test_model tests/unit/test_model_optim
tests_unit_test_layers_SOURCES = tests/unit/test_layers.c
tests_unit_test_layers_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_layers_LDADD = $(TEST_LIBS)
tests_unit_test_model_SOURCES = tests/unit/test_model.c
tests_unit_test_model_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_model_LDADD = $(TEST_LIBS)
tests_unit_test_model_optim_SOURCES = tests/unit/test_model_optim.c
tests_unit_test_model_optim_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_model_optim_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_layers tests/unit/test_model tests/unit/test_model_optim
check_PROGRAMS += tests/unit/test_moe
tests_unit_test_moe_SOURCES = tests/unit/test_moe.c tests/unit/moe_fixture.h
tests_unit_test_moe_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_moe_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_moe
# the layer on other devices and dtypes (cuda:0 when visible) against the host in f32
check_PROGRAMS += tests/unit/test_moe_device
tests_unit_test_moe_device_SOURCES = tests/unit/test_moe_device.c tests/unit/moe_fixture.h
tests_unit_test_moe_device_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_moe_device_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_moe_device
endif
if HAVE_CHECK
check_PROGRAMS += tests/unit/test_lora
tests_unit_test_lora_SOURCES = tests/unit/test_lora.c
tests_unit_test_lora_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_lora_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_lora
check_PROGRAMS += tests/unit/test_fp8_model
tests_unit_test_fp8_model_SOURCES = tests/unit/test_fp8_model.c
tests_unit_test_fp8_model_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_fp8_model_LDADD = $(TEST_LIBS)
TESTS += tests/unit/test_fp8_model
endif
check_PROGRAMS += tests/unit/test_lora_logits
tests_unit_test_lora_logits_SOURCES = tests/unit/test_lora_logits.c
tests_unit_test_lora_logits_LDADD = src/libcolossal-core.la
