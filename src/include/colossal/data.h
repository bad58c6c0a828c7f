/* The data layer: byte-level BPE tokenizer, Megatron-compatible indexed
 * datasets, GPT-style sample packing/blending and a deterministic
 * distributed sampler, plus the embedded default corpus. */
#ifndef COLOSSAL_DATA_H
#define COLOSSAL_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "colossal/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Tokenizer (src/data/bpe*.c)
 * ====================================================================== */

/* ====================================================== end of tokenizer */

/* ======================================================================
 * Datasets, sampling, corpus (src/data/indexed*.c, sampler*.c, corpus*.c)
 * ====================================================================== */

/* ======================================================= end of datasets */

#ifdef __cplusplus
}
#endif
#endif
