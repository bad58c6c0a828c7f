# colossal-data: preprocess and sft-preprocess (MPI-parallel), train-tokenizer, corpus, info,
# sft-example.
bin_PROGRAMS += apps/colossal-data
apps_colossal_data_SOURCES = apps/data.c $(APP_COMMON_SOURCES)
apps_colossal_data_LDADD = $(APP_LDADD)

# End-to-end tests of colossal-data (shell, run under $(MPIEXEC)).
DATA_APP_TESTS = \
	tests/apps/data_preprocess.sh \
	tests/apps/data_megatron.sh \
	tests/apps/data_errors.sh \
	tests/apps/data_tokenizer.sh \
	tests/apps/data_sft.sh
TESTS += $(DATA_APP_TESTS)
EXTRA_DIST += $(DATA_APP_TESTS) tests/apps/data_lib.sh
