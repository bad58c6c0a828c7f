# PyTorch parity: a C driver writes a tiny model's parameters, logits, loss,
# gradients and post-AdamW parameters to safetensors; an independent PyTorch
# reference (float64) recomputes them and compares. See docs/parity.md.
check_PROGRAMS += tests/parity/parity_driver
tests_parity_parity_driver_SOURCES = tests/parity/parity_driver.c
tests_parity_parity_driver_LDADD = src/libcolossal-core.la

TESTS += tests/parity/gpt2.sh tests/parity/llama.sh
EXTRA_DIST += tests/parity/gpt2.sh tests/parity/llama.sh tests/parity/run-parity.sh \
	tests/parity/torch_reference.py
CLEANFILES += tests/parity/gpt2.safetensors tests/parity/llama.safetensors

# The MoE sublayer against a PyTorch reference (docs/moe.md).
check_PROGRAMS += tests/parity/moe_driver
tests_parity_moe_driver_SOURCES = tests/parity/moe_driver.c tests/unit/moe_fixture.h
tests_parity_moe_driver_LDADD = src/libcolossal-core.la
TESTS += tests/parity/moe.sh
EXTRA_DIST += tests/parity/moe.sh tests/parity/moe_reference.py
CLEANFILES += tests/parity/moe.safetensors

# LoRA adapters against a PyTorch reference LoRA (docs/sft.md "LoRA").
check_PROGRAMS += tests/parity/lora_parity
tests_parity_lora_parity_SOURCES = tests/parity/lora_parity.c
tests_parity_lora_parity_LDADD = src/libcolossal-core.la
TESTS += tests/parity/lora.sh tests/parity/lora_hf.sh
EXTRA_DIST += tests/parity/lora.sh tests/parity/lora_hf.sh tests/parity/lora_reference.py
CLEANFILES += tests/parity/lora.safetensors

# Ring attention and Ulysses against a PyTorch reference (docs/sequence-parallel.md).
check_PROGRAMS += tests/parity/sp_driver
tests_parity_sp_driver_SOURCES = tests/parity/sp_driver.c
tests_parity_sp_driver_LDADD = src/libcolossal-core.la
TESTS += tests/parity/sp.sh
EXTRA_DIST += tests/parity/sp.sh tests/parity/sp_reference.py
CLEANFILES += tests/parity/sp2.safetensors tests/parity/sp4.safetensors

# The alignment objectives against PyTorch references (docs/rlhf.md).
check_PROGRAMS += tests/parity/rl_parity
tests_parity_rl_parity_SOURCES = tests/parity/rl_parity.c
tests_parity_rl_parity_LDADD = src/libcolossal-core.la
TESTS += tests/parity/rl.sh
EXTRA_DIST += tests/parity/rl.sh tests/parity/rl_reference.py
CLEANFILES += tests/parity/rl.safetensors
