# colossal-ckpt: inspect, verify, export, import, convert, init (docs/huggingface.md).
bin_PROGRAMS += apps/colossal-ckpt
apps_colossal_ckpt_SOURCES = apps/ckpt.c $(APP_COMMON_SOURCES)
apps_colossal_ckpt_LDADD = $(APP_LDADD)

# End-to-end tests of colossal-ckpt and the Hugging Face interchange (shell).
CKPT_HF_APP_TESTS = \
	tests/apps/ckpt_hf_tool.sh \
	tests/apps/ckpt_hf_torch.sh
TESTS += $(CKPT_HF_APP_TESTS)
EXTRA_DIST += $(CKPT_HF_APP_TESTS) tests/apps/ckpt_hf_lib.sh tests/apps/ckpt_hf_pretrain.sh
# HDF5 checkpoint <-> Hugging Face from a colossal-pretrain run
if HAVE_HDF5
TESTS += tests/apps/ckpt_hf_pretrain.sh
endif
