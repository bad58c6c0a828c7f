/* The checkpoint layer: safetensors files (Hugging Face interchange) and,
 * appended by its owner, parallel HDF5 checkpoints.
 *
 * The safetensors section is a strict reader and a writer of the format as
 * the reference implementation produces it; mapping colossal's registry
 * names and layouts to Hugging Face ones is the exporter's job, above this.
 * See docs/safetensors.md. */
#ifndef COLOSSAL_CKPT_H
#define COLOSSAL_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"
#include "colossal/cluster.h"  /* Checkpoints section: meshes */
#include "colossal/optim.h"    /* Checkpoints section: model, registry and optimizer */
#include "colossal/parallel.h" /* Checkpoints section: ZeRO engines */
#include "colossal/model.h"    /* Hugging Face section: model configs and registries */

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * safetensors (src/ckpt/safetensors.c)
 * None of these calls is collective: every function acts on this rank's
 * file handle only. Several ranks may open (mmap) the same file at once.
 * ====================================================================== */

#define CAI_ST_MAX_DIMS 8
/* The reference implementation refuses larger headers; so do we. */
#define CAI_ST_MAX_HEADER (100u * 1000u * 1000u)

/* One tensor to write. Data is little-endian, row-major, numel * size of
 * dtype bytes; ndim 0 is a scalar (one element). */
typedef struct {
    const char *name;
    cai_dtype dtype;
    int ndim;
    uint64_t shape[CAI_ST_MAX_DIMS];
    const void *data; /* ignored by cai_safetensors_writer_open */
} cai_st_tensor;

/* A `__metadata__` entry (string to string). "format" is always "pt". */
typedef struct {
    const char *key, *value;
} cai_st_meta;

/* Writes the whole file at once: to `path`.tmp.<pid>, fsync, then rename, so
 * a reader never sees a half-written file. Tensors are laid out by element
 * size (largest first), then name, so every tensor starts aligned to its
 * element size, as the reference writer does. */
cai_status cai_safetensors_write(const char *path, const cai_st_tensor *tensors, int n, const cai_st_meta *meta,
                                 int n_meta);

/* Streaming writer for tensors that do not all fit in memory at once (HF
 * export gathers one at a time): the header is fixed from the descriptors,
 * then each tensor's bytes are put, in any order, once each. */
typedef struct cai_st_writer cai_st_writer_t;
cai_status cai_safetensors_writer_open(cai_st_writer_t **out, const char *path, const cai_st_tensor *tensors, int n,
                                       const cai_st_meta *meta, int n_meta);
cai_status cai_safetensors_writer_put(cai_st_writer_t *w, const char *name, const void *data);
/* Fails (and removes the temporary file) if any tensor was never put. */
cai_status cai_safetensors_writer_close(cai_st_writer_t *w);
/* Gives up: removes the temporary file and frees the writer. */
void cai_safetensors_writer_abort(cai_st_writer_t *w);

/* One tensor of an opened file. Pointers stay valid until close. */
typedef struct {
    const char *name;
    const char *dtype_name; /* as spelled in the file: "F32", "BF16", "BOOL", "F8_E4M3", ... */
    cai_dtype dtype;        /* CAI_DTYPE_COUNT when colossal has no such type (BOOL, I8, F8_*, ...) */
    size_t elem_size;
    int ndim;
    uint64_t shape[CAI_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end; /* data_offsets, relative to the start of the data section */
    const void *data;    /* in the read-only mapping; may be unaligned for foreign files */
} cai_st_entry;

typedef struct cai_safetensors cai_safetensors_t;

/* Maps the file read-only and validates it completely before returning:
 * header length against the file size, JSON syntax, every entry's fields and
 * dtype, shape * element size against its byte range, and that the ranges
 * tile the data section exactly (no gap, overlap or trailing bytes). Errors
 * are CAI_ERR_FORMAT (CAI_ERR_IO for the file system) and name the file and
 * the tensor or field at fault. */
cai_status cai_safetensors_open(cai_safetensors_t **out, const char *path);
void cai_safetensors_close(cai_safetensors_t *st);
const char *cai_safetensors_path(const cai_safetensors_t *st);
/* Entries are ordered by their position in the data section. */
int cai_safetensors_count(const cai_safetensors_t *st);
const cai_st_entry *cai_safetensors_entry(const cai_safetensors_t *st, int i);
/* NULL when absent; cai_safetensors_get reports the miss as an error. */
const cai_st_entry *cai_safetensors_find(const cai_safetensors_t *st, const char *name);
cai_status cai_safetensors_get(const cai_safetensors_t *st, const char *name, const cai_st_entry **out);
/* `__metadata__` lookups; NULL when absent. */
const char *cai_safetensors_meta(const cai_safetensors_t *st, const char *key);
int cai_safetensors_meta_count(const cai_safetensors_t *st);
void cai_safetensors_meta_at(const cai_safetensors_t *st, int i, const char **key, const char **value);
/* Copies tensor `name` into dst after checking that it has exactly this
 * dtype and shape; the error names the file, the tensor and both shapes. */
cai_status cai_safetensors_read(const cai_safetensors_t *st, const char *name, cai_dtype dtype, int ndim,
                                const uint64_t *shape, void *dst);

/* "F32", "BF16", ... for a colossal dtype (NULL if none). */
const char *cai_safetensors_dtype_name(cai_dtype dtype);

/* ================================================= end of safetensors */

/* ======================================================================
 * Hugging Face (src/ckpt/hf_map.c, hf_config.c, hf_export.c, hf_import.c)
 * A Hugging Face model directory: config.json, the weights as
 * model.safetensors or as model-0000i-of-0000K.safetensors shards listed in
 * model.safetensors.index.json, and tokenizer files. GPT-2 is
 * GPT2LMHeadModel, Llama LlamaForCausalLM. One mapping table per model
 * config, colossal name <-> HF name with a transform, serves both export and
 * import. Nothing here is collective: export from the rank holding the
 * global tensors; import on any number of ranks at once (read-only mmaps).
 * See docs/huggingface.md.
 * ====================================================================== */

typedef enum {
    CAI_HF_COPY = 0,   /* same layout */
    CAI_HF_TRANSPOSE,  /* GPT-2 Conv1D: HF [in, out] is colossal's [out, in] transposed */
    CAI_HF_QKV_SLICE,  /* Llama q/k/v_proj: a block of rows of the fused qkv weight */
    CAI_HF_VOCAB_ROWS, /* embedding / LM head: the real vocab_size rows; the padding rows
                        * are dropped on export and zero on import */
    CAI_HF_TRANSFORM_COUNT
} cai_hf_transform;

/* One HF tensor: rows [row_begin, row_begin + rows) of colossal parameter
 * `colossal` (dim 0; all rows for COPY and TRANSPOSE), transposed for
 * CAI_HF_TRANSPOSE. */
typedef struct {
    const char *colossal; /* canonical registry name */
    const char *hf;       /* Hugging Face name */
    cai_hf_transform transform;
    uint64_t row_begin, rows;
    int ndim; /* of the HF tensor: 1 or 2 */
    uint64_t hf_shape[2];
} cai_hf_entry;

const char *cai_hf_transform_name(cai_hf_transform t);
/* "GPT2LMHeadModel" / "LlamaForCausalLM" / "MixtralForCausalLM" (a Llama
 * with MoE blocks); "gpt2" / "llama" / "mixtral". NULL: no HF counterpart. */
const char *cai_hf_architecture(const cai_model_config *cfg);
const char *cai_hf_model_type(const cai_model_config *cfg);
/* What MixtralForCausalLM cannot express of an MoE config (shared experts,
 * moe_every != 1, a router other than softmax with norm_topk): refused with
 * the field named. CAI_OK for a dense config. */
cai_status cai_hf_mixtral_check(const cai_model_config *cfg);

/* The mapping for one model config: every HF tensor of the family's
 * checkpoint in the order transformers saves them (a tied head has none).
 * It owns a registry built from the resolved config. Fails with
 * CAI_ERR_UNSUPPORTED for a registered parameter with no HF counterpart. */
typedef struct cai_hf_map cai_hf_map_t;
cai_status cai_hf_map_create(cai_hf_map_t **out, const cai_model_config *cfg);
void cai_hf_map_free(cai_hf_map_t *map);
const cai_model_config *cai_hf_map_config(const cai_hf_map_t *map); /* resolved */
const cai_registry_t *cai_hf_map_registry(const cai_hf_map_t *map);
int cai_hf_map_count(const cai_hf_map_t *map);
const cai_hf_entry *cai_hf_map_entry(const cai_hf_map_t *map, int i);
/* NULL when absent. */
const cai_hf_entry *cai_hf_map_find_hf(const cai_hf_map_t *map, const char *hf_name);
/* The entries holding colossal parameter `name` (consecutive in the table):
 * the count (1; 3 for Llama's qkv; 0 for a tied head or an unknown name) and
 * the first in *first. */
int cai_hf_map_find(const cai_hf_map_t *map, const char *name, const cai_hf_entry **first);

/* config.json for `cfg` (resolved here) as transformers reads it; the
 * weights' dtype goes to torch_dtype; bos/eos token ids < 0 are omitted.
 * *out is malloc'd text (free() it). */
cai_status cai_hf_config_json(const cai_model_config *cfg, cai_dtype dtype, int bos_token_id, int eos_token_id,
                              char **out);
/* Parse a config.json into a model config: the architecture fields from the
 * file, everything else from cai_model_config_default(family) (F32, seed,
 * vocab_multiple 0 = 128). Errors name the file and the key: missing or
 * mistyped keys, an unknown architecture or model_type, and features colossal
 * does not implement (rope_scaling, attention biases, another activation),
 * which are CAI_ERR_UNSUPPORTED. */
cai_status cai_hf_config_load(const char *path, cai_model_config *out);

/* ------------------------------------------------------------ export */

#define CAI_HF_DEFAULT_SHARD_BYTES 5000000000ull /* transformers' default max_shard_size "5GB" */

typedef struct {
    cai_dtype dtype;           /* F32, BF16 or F16 (round to nearest even from the F32 masters) */
    uint64_t max_shard_bytes;  /* tensor bytes per file; a larger total is sharded with an index.
                                * 0: CAI_HF_DEFAULT_SHARD_BYTES */
    const char *tokenizer_dir; /* copy the tokenizer files found here; NULL or "": none */
} cai_hf_export_options;

/* F32, default shard size, no tokenizer. */
cai_hf_export_options cai_hf_export_options_default(void);

typedef struct {
    int n_files; /* weight files (1 when not sharded) */
    int n_tensors;
    uint64_t total_bytes; /* tensor bytes (the index's total_size) */
    int tokenizer_files;  /* copied or written */
    double seconds;
} cai_hf_export_stats;

/* Supplies one parameter's GLOBAL tensor (param->shape, padded vocabulary
 * rows included) as row-major F32 into dst (param->numel floats). Called
 * once per exported parameter, in registration order; tie copies are never
 * asked for. */
typedef cai_status (*cai_hf_source_fn)(void *ctx, const cai_param_info *param, float *dst);

/* Write the directory `dir` (created if missing): the weights (one tensor
 * in memory at a time), then model.safetensors.index.json when sharded,
 * then the tokenizer files, then config.json. Every file is written under a
 * temporary name and renamed; weight files of an earlier export that this
 * one does not use (model*.safetensors, a stale index) are removed. With a
 * tokenizer, its largest id must be below cfg->vocab_size, and its
 * <|endoftext|> (or <s>, </s>) ids become bos/eos_token_id. `stats` may be
 * NULL. */
cai_status cai_hf_export(const char *dir, const cai_model_config *cfg, cai_hf_source_fn source, void *ctx,
                         const cai_hf_export_options *opt, cai_hf_export_stats *stats);
/* From a model whose view holds every parameter whole (single rank, or
 * gathered); otherwise CAI_ERR_UNSUPPORTED naming the first missing one. */
cai_status cai_hf_export_model(const char *dir, cai_model_t *m, const cai_hf_export_options *opt,
                               cai_hf_export_stats *stats);
/* From a host flat F32 buffer of flat_count floats laid out by
 * cai_registry_local_layout(reg, single-rank view, align_elems): every
 * parameter of cfg's mapping must be in `reg` with the shape cfg gives it
 * (the error names the parameter and both shapes). */
cai_status cai_hf_export_flat(const char *dir, const cai_model_config *cfg, const cai_registry_t *reg,
                              const float *flat, size_t flat_count, size_t align_elems,
                              const cai_hf_export_options *opt, cai_hf_export_stats *stats);

/* ------------------------------------------------------------ import */

typedef struct cai_hf cai_hf_t;

/* Open and validate a directory completely before anything is read into a
 * model: config.json (cai_hf_config_load), model.safetensors or the index
 * and every shard it names, every mapped tensor present with the shape the
 * config implies and dtype F32, BF16 or F16, and no tensor the mapping does
 * not know (buffers transformers used to save, attn.bias and
 * rotary_emb.inv_freq, and a tied lm_head.weight are skipped). GPT-2 names
 * with or without the "transformer." prefix are accepted. Errors name the
 * file and the tensor. */
cai_status cai_hf_open(cai_hf_t **out, const char *dir);
void cai_hf_close(cai_hf_t *h);
const char *cai_hf_dir(const cai_hf_t *h);
/* The model config built from config.json (resolved; vocab_multiple 128). */
const cai_model_config *cai_hf_config(const cai_hf_t *h);
const cai_hf_map_t *cai_hf_map(const cai_hf_t *h);
/* The weight files in the order the index names them, and whether it is
 * sharded (index total_size in *total_size, 0 when unsharded or absent). */
int cai_hf_file_count(const cai_hf_t *h);
const cai_safetensors_t *cai_hf_file(const cai_hf_t *h, int i);
int cai_hf_sharded(const cai_hf_t *h, uint64_t *total_size);
/* The HF tensor of a mapping entry (from cai_hf_map(h)) and its file. */
const cai_st_entry *cai_hf_tensor(const cai_hf_t *h, const cai_hf_entry *e, const cai_safetensors_t **file);

/* One parameter's global F32 tensor (padding rows zero), shaped as `param`
 * says: the shapes of cai_hf_map_registry(cai_hf_map(h)), except that
 * vocabulary rows may be padded to any multiple. A tie copy reads its
 * primary's tensor. */
cai_status cai_hf_read_param(cai_hf_t *h, const cai_param_info *param, float *dst);

/* Receives each parameter's global tensor, in registration order. */
typedef cai_status (*cai_hf_sink_fn)(void *ctx, const cai_param_info *param, const float *src);
/* Every parameter of `reg` (NULL: the mapping's registry) through sink. */
cai_status cai_hf_import(cai_hf_t *h, const cai_registry_t *reg, cai_hf_sink_fn sink, void *ctx);
/* Into a model (any pipeline stage: each held shard is cut from the global
 * tensor), then cai_model_params_updated. The model's architecture must
 * match config.json (family, vocab_size, layers, widths, heads, kv heads,
 * ffn, max_seq_len, tied head; vocab_multiple, dtypes and seed are free);
 * the error names the first field that differs. */
cai_status cai_hf_import_model(cai_hf_t *h, cai_model_t *m);
/* The same into a weights object with storage (an inference engine's). */
cai_status cai_hf_import_weights(cai_hf_t *h, cai_weights_t *w);
/* The weights of config.json into a ZeRO engine's masters (any stage,
 * with or without offload, any tp/pp view: cai_zero_load_params), then its
 * working weights. The model may hold a larger vocabulary than
 * config.json's (special tokens added): rows [file vocab, model vocab) of
 * the embedding and an untied LM head start as the mean of the file's rows
 * (cai_ckpt_grow_vocab_rows). Collective over the engine's dp axis. */
cai_status cai_hf_import_zero(cai_hf_t *h, cai_zero_t *z);
/* Rows [source_vocab, vocab) of a vocabulary-row tensor (registered with
 * vocab_parallel, split on dimension 0), given as its whole global value,
 * set to the mean of rows [0, source_vocab) (summed in row order in double:
 * the same on every rank), as transformers' resize_token_embeddings with
 * mean initialisation starts added tokens. Other tensors are left as they
 * are. Not collective. */
void cai_ckpt_grow_vocab_rows(const cai_param_info *param, float *global, int64_t source_vocab, int64_t vocab);
/* Into a host flat F32 buffer of flat_count floats laid out by
 * cai_registry_local_layout(reg, single-rank view, align_elems); alignment
 * gaps are zeroed. */
cai_status cai_hf_import_flat(cai_hf_t *h, const cai_registry_t *reg, float *flat, size_t flat_count,
                              size_t align_elems);

/* ========================================================= end of Hugging Face */

/* ======================================================================
 * Checkpoints: parallel HDF5 (src/ckpt/checkpoint*.c, src/ckpt/h5io.c)
 * One HDF5 file per checkpoint, written collectively through MPI-IO: every
 * tensor is a dataset of its GLOBAL shape and each rank writes and reads
 * only its own hyperslabs, taken from the parameter registry, so a
 * checkpoint loads under any other layout (dp, and by construction tp, pp,
 * ep; ZeRO shards are ranges of the flat buffers, see cai_ckpt_buffer).
 * Weights, fp32 masters, optimizer moments, and as attributes the model
 * config, step, tokens, sampler position, LR schedule, loss scaler, RNG
 * state and the layout at save. Every tensor carries an order-independent
 * checksum. A checkpoint is written under a temporary name and renamed only
 * once it is complete and closed on every rank. Format: docs/checkpoint.md.
 * Built without parallel HDF5 (CAI_HAVE_HDF5 0) every call that touches an
 * HDF5 file fails with CAI_ERR_UNSUPPORTED; the directory helpers work.
 * ====================================================================== */

#define CAI_CKPT_FORMAT "colossal-checkpoint"
#define CAI_CKPT_VERSION 1
#define CAI_CKPT_NAME_MAX 192 /* dataset path ("optim/exp_avg/h.0.attn.qkv.weight"), with the NUL */
#define CAI_CKPT_MAX_DIMS 8

/* What a checkpoint holds besides tensors. Saving reads the fields marked
 * "in"; loading fills every field. */
typedef struct {
    /* in: training position */
    int64_t step;             /* training steps taken (on load the optimizer's step count, unless optim_step) */
    int64_t optim_step;       /* updates the optimizer applied when fewer than `step` (f16 steps skipped on
                               * overflow); 0: equal to step. On load: the count to continue from (the LR
                               * schedule and AdamW's bias correction follow it); `step` for older files */
    int64_t tokens;           /* tokens trained on */
    int64_t consumed_samples; /* data sampler position (cai_sampler_consumed) */
    uint64_t data_seed;       /* sample order */
    /* in: counter-based RNG of stochastic ops (dropout, stochastic rounding):
     * its whole state is a seed and the next counter offset */
    uint64_t rng_seed, rng_offset;
    /* in: dynamic loss scaler (scale 1, 0 good steps when there is none):
     * cai_loss_scaler's scale, good_steps, hysteresis_left, overflows */
    double loss_scale;
    int64_t loss_scale_good_steps;
    int64_t loss_scale_hysteresis_left, loss_scale_overflows;
    /* in: informational */
    double last_lr, last_loss;
    char app[64];      /* the writer, e.g. "colossal-pretrain" */
    char *config_text; /* the app's effective config (YAML) or NULL; on load malloc'd
                        * (cai_ckpt_meta_free), NULL when the file has none */
    /* the FP8 scaling state (cai_fp8_state, colossal/fp8.h: the same on
     * every rank) or NULL; on load malloc'd (cai_ckpt_meta_free), NULL when
     * the file has none. Stored as the 1-D F32 dataset "fp8_state". */
    float *fp8_state;
    size_t fp8_state_len;
    /* an app's own small state that rides with the weights (colossal-rlhf's
     * scalar head and its AdamW moments), the same on every rank, or NULL;
     * on load malloc'd (cai_ckpt_meta_free), NULL when the file has none.
     * Stored as the 1-D F32 dataset "app_state". */
    float *app_state;
    size_t app_state_len;
    /* in (cai_ckpt_save fills them from the model, optimizer and mesh) */
    cai_model_config model; /* resolved */
    int has_model;
    cai_adamw_config optim; /* including the LR schedule */
    int has_optim;          /* the file holds optimizer moments */
    cai_layout layout;      /* the layout at save (order NULL on load) */
    int world_size;
    /* out (load only) */
    int format_version;
    char colossal_version[32];
    int64_t created_unix;
} cai_ckpt_meta;

/* Zeroed meta with loss_scale 1. */
cai_ckpt_meta cai_ckpt_meta_init(void);
/* 1 when this build can read and write checkpoints (parallel HDF5), so an
 * app can refuse checkpoint options before it trains. Pure. */
int cai_ckpt_available(void);
void cai_ckpt_meta_free(cai_ckpt_meta *meta);

/* Measured by a save or load (this rank's view; times are this rank's). */
typedef struct {
    double seconds;      /* the whole call */
    double io_seconds;   /* inside H5Dwrite / H5Dread */
    uint64_t bytes;      /* tensor bytes in the file (each element once) */
    uint64_t rank_bytes; /* tensor bytes this rank moved */
    int n_datasets;
    int n_transfers;  /* H5Dwrite / H5Dread calls on this rank */
    int n_collective; /* of them, those HDF5 performed collectively (H5Pget_mpio_actual_io_mode) */
} cai_ckpt_stats;

/* ---------------------------------------------------------- model + optimizer */

/* Write `path` (atomically: `path` appears only when complete) with the
 * model's weights ("model/<name>" in param_dtype), the fp32 masters when
 * param_dtype is not F32 ("master/<name>"), and with `optim` (may be NULL)
 * the AdamW moments ("optim/exp_avg/<name>", "optim/exp_avg_sq/<name>").
 * Tied copies are stored once, under the tie group's first member. meta may
 * be NULL; its model/optim/layout fields are filled here. stats may be
 * NULL. Collective over the mesh's world. */
cai_status cai_ckpt_save(cai_mesh_t *mesh, const char *path, cai_model_t *model, cai_optim_t *optim,
                         const cai_ckpt_meta *meta, cai_ckpt_stats *stats);

/* Read a checkpoint into `model` (any layout: each rank reads its own
 * hyperslabs) and, with `optim`, the moments and step count (the file must
 * hold them). Before any tensor is read the file is checked to be a
 * colossal checkpoint of the same architecture (family, sizes, vocabulary,
 * tying); then each tensor's shape and element type, and after reading its
 * checksum. Errors name the file and the tensor or field (CAI_ERR_FORMAT
 * for a damaged or foreign file, CAI_ERR_IO when it cannot be opened);
 * after a failure the model's and optimizer's contents are unspecified.
 * meta (may be NULL) receives the stored metadata. Collective over the
 * mesh's world. */
cai_status cai_ckpt_load(cai_mesh_t *mesh, const char *path, cai_model_t *model, cai_optim_t *optim,
                         cai_ckpt_meta *meta, cai_ckpt_stats *stats);
/* The weights of a checkpoint (the fp32 masters, or the weights of an f32
 * run) into a weights object with storage, under its view: the file may
 * have been written under any layout. The stored model config must match
 * w's architecture. meta and stats may be NULL. Collective over the mesh's
 * world. */
cai_status cai_ckpt_load_weights(cai_mesh_t *mesh, const char *path, cai_weights_t *w, cai_ckpt_meta *meta,
                                 cai_ckpt_stats *stats);

/* ---------------------------------------------------------- ZeRO engines
 * The same file, from and into the state a ZeRO engine holds (any stage,
 * with or without offload): "model/<name>" (the working weights, rounded
 * from the masters into param_dtype), "master/<name>" when param_dtype is
 * not F32, and the AdamW moments, every tensor of its global shape. Each
 * rank writes the pieces of its shard (cai_zero_pieces; stage 0 with
 * offload: the replicas split the whole buffers) and a load reads the
 * pieces of the shard it holds now, so a checkpoint saved under any dp
 * size, stage or offload setting — or by cai_ckpt_save — loads under any
 * other: the optimizer state reshards. A reduce-only engine
 * (cai_zero_config.reduce_only) keeps its state in the model and in the
 * caller's optimizer `optim`: these calls are then cai_ckpt_save /
 * cai_ckpt_load of that pair. */

/* `oc` is the AdamW config the engine steps with (recorded in the file;
 * ignored for a reduce-only engine, whose `optim` carries its own). With
 * meta NULL the step is the engine's count. Collective over the mesh's
 * world. */
cai_status cai_ckpt_save_zero(cai_mesh_t *mesh, const char *path, cai_zero_t *zero, cai_optim_t *optim,
                              const cai_adamw_config *oc, const cai_ckpt_meta *meta, cai_ckpt_stats *stats);
/* Checks the file as cai_ckpt_load does, reads the masters and moments of
 * this rank's shard, re-derives the working weights
 * (cai_zero_state_loaded) and sets the engine's (or optim's) step count
 * from the file. Collective over the mesh's world. */
cai_status cai_ckpt_load_zero(cai_mesh_t *mesh, const char *path, cai_zero_t *zero, cai_optim_t *optim,
                              cai_ckpt_meta *meta, cai_ckpt_stats *stats);

/* The weights of a checkpoint (its masters, or the weights of an f32 run;
 * saved under any layout) into a ZeRO engine's masters (any stage, with or
 * without offload), moments and step count left at zero, then its working
 * weights: a run starting from another run's weights. The file's
 * architecture must be the model's except for a smaller vocabulary, whose
 * added rows start as the mean of the file's (cai_ckpt_grow_vocab_rows):
 * then every tensor is read whole on every rank (cai_zero_load_params);
 * with the same shapes each rank reads only its pieces, as
 * cai_ckpt_load_zero does. Collective over the mesh's world. */
cai_status cai_ckpt_load_zero_weights(cai_mesh_t *mesh, const char *path, cai_zero_t *zero);

/* ---------------------------------------------------------- directories
 * A checkpoint directory holds step-<N>.h5 files (N zero-padded to 8
 * digits), a text file `latest` naming the newest complete one, and while a
 * save runs a hidden temporary file. */

/* Save step meta->step as DIR/step-<N>.h5 (creating DIR), then point
 * `latest` at it (written under a temporary name and renamed), then delete
 * all but the newest `keep` checkpoints (keep <= 0: keep all) and stale
 * temporary files of interrupted saves. A crash at any moment leaves the
 * previous checkpoint and `latest` intact. path_out (may be NULL) receives
 * the file written. Collective over the mesh's world. */
cai_status cai_ckpt_save_step(cai_mesh_t *mesh, const char *dir, int keep, cai_model_t *model, cai_optim_t *optim,
                              const cai_ckpt_meta *meta, char *path_out, size_t cap, cai_ckpt_stats *stats);
/* cai_ckpt_save_step through cai_ckpt_save_zero. */
cai_status cai_ckpt_save_step_zero(cai_mesh_t *mesh, const char *dir, int keep, cai_zero_t *zero, cai_optim_t *optim,
                                   const cai_adamw_config *oc, const cai_ckpt_meta *meta, char *path_out, size_t cap,
                                   cai_ckpt_stats *stats);
/* The same directory protocol around a file the caller writes: write(ctx,
 * mesh, path, meta, stats) must write `path` atomically (cai_ckpt_save_buffers
 * does), e.g. a LoRA run's adapters. Collective over the mesh's world. */
typedef cai_status (*cai_ckpt_write_fn)(void *ctx, cai_mesh_t *mesh, const char *path, const cai_ckpt_meta *meta,
                                        cai_ckpt_stats *stats);
cai_status cai_ckpt_save_step_with(cai_mesh_t *mesh, const char *dir, int keep, int64_t step, cai_ckpt_write_fn write,
                                   void *ctx, const cai_ckpt_meta *meta, char *path_out, size_t cap,
                                   cai_ckpt_stats *stats);
/* DIR/step-<N>.h5 into out. Not collective. */
cai_status cai_ckpt_step_path(const char *dir, int64_t step, char *out, size_t cap);
/* The checkpoint `latest` in DIR names, into out; *found = 0 (and CAI_OK)
 * when DIR or its `latest` does not exist. A `latest` naming a missing file
 * is an error. Not collective. */
cai_status cai_ckpt_latest(const char *dir, char *out, size_t cap, int *found);
/* A checkpoint file as given, or for a directory the file its `latest`
 * names (an error when there is none). Not collective. */
cai_status cai_ckpt_resolve(const char *path, char *out, size_t cap);
/* The steps of DIR's step-<N>.h5 files, newest first, in a malloc'd array
 * (free() it); none (and CAI_OK) when DIR does not exist. Not collective. */
cai_status cai_ckpt_list_steps(const char *dir, int64_t **steps, size_t *n);

/* ---------------------------------------------------------- flat buffers
 * The layer underneath cai_ckpt_save/load, for callers whose buffers are
 * not a cai_model_t / cai_optim_t pair (a ZeRO partition, an exporter).
 * Every buffer is laid out as cai_registry_local_layout(reg, view,
 * align_elems) describes; `group` gets one dataset per tie-group primary
 * parameter, of its global shape. */

typedef struct {
    const cai_registry_t *reg;
    cai_rank_view view;
    size_t align_elems;
    /* The axis over which ranks hold the same elements of a `replicated`
     * buffer (they share the writing, each a balanced slice);
     * CAI_AXIS_COUNT: no replicas. cai_ckpt_save uses CAI_AXIS_DP_SP. */
    cai_axis replica_axis;
} cai_ckpt_layout;

/* A run of parameter `index`'s local elements (its TP/PP shard, row-major)
 * [param_offset, param_offset + count), stored at [buffer_offset,
 * buffer_offset + count) of a buffer: the shape of a ZeRO shard's pieces
 * (cai_zero_piece). See cai_ckpt_save_pieces. */
typedef struct {
    int index;
    size_t param_offset, buffer_offset, count;
} cai_ckpt_piece;

typedef struct {
    const char *group;     /* "model", "optim/exp_avg", ... */
    const char *alt_group; /* load: read this group when `group` is not in the file (NULL: none) */
    void *data;            /* elements [flat_begin, flat_end) of the flat layout, host memory or on dev */
    cai_device_t *dev;     /* NULL: host memory */
    cai_dtype dtype;       /* of data: F32, BF16 or F16 */
    cai_dtype file_dtype;  /* in the file (save); load converts from whatever the file holds */
    /* Which elements of the flat layout this rank holds: [0, 0) means all
     * of them; a sub-range is a partition of the flat layout (ZeRO shards
     * made of several runs use cai_ckpt_save_pieces). Each parameter's part
     * is a range of its shard's local elements, which the plan maps to
     * global hyperslabs like any other. */
    size_t flat_begin, flat_end;
    int replicated;      /* 1: the replica_axis peers hold the same elements (they split the writing) */
    int skip_tie_copies; /* load: leave tie copies whose primary this rank holds untouched (their
                          * optimizer moments are unused) */
} cai_ckpt_buffer;

/* Collective over the mesh's world. meta (not NULL) must have has_model
 * set; path is written atomically as in cai_ckpt_save. */
cai_status cai_ckpt_save_buffers(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                 const cai_ckpt_buffer *bufs, int n_bufs, const cai_ckpt_meta *meta,
                                 cai_ckpt_stats *stats);
/* Collective over the mesh's world; checks format and tensors (shape,
 * element type, checksum) as cai_ckpt_load does, but not the model config. */
cai_status cai_ckpt_load_buffers(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                 const cai_ckpt_buffer *bufs, int n_bufs, cai_ckpt_meta *meta, cai_ckpt_stats *stats);
/* The same with ZeRO shards: pieces[b] (NULL for a flat buffer) lists the
 * runs buffer b holds, n_pieces[b] of them; such a buffer holds exactly
 * these elements (its flat_begin/flat_end and `replicated` are ignored;
 * each element lives on one rank of its replica group, which writes it).
 * Pass cai_zero_pieces' list cast element-wise: it has the same fields. */
cai_status cai_ckpt_save_pieces(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                const cai_ckpt_buffer *bufs, const cai_ckpt_piece *const *pieces, const int *n_pieces,
                                int n_bufs, const cai_ckpt_meta *meta, cai_ckpt_stats *stats);
cai_status cai_ckpt_load_pieces(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                const cai_ckpt_buffer *bufs, const cai_ckpt_piece *const *pieces, const int *n_pieces,
                                int n_bufs, cai_ckpt_meta *meta, cai_ckpt_stats *stats);

/* ---------------------------------------------------------- inspection
 * For tools (colossal-ckpt inspect / verify / export): open a checkpoint on
 * any number of ranks, list its datasets, read global tensors, recompute
 * checksums. */

typedef struct {
    char name[CAI_CKPT_NAME_MAX]; /* full path without the leading '/': "model/wte.weight" */
    cai_dtype dtype;              /* CAI_DTYPE_COUNT when not F32/BF16/F16 */
    char dtype_desc[32];          /* "f32", "bf16", "f16", or HDF5's class and size */
    int ndim;
    uint64_t shape[CAI_CKPT_MAX_DIMS];
    uint64_t numel;
    int has_checksum;
    uint64_t checksum; /* stored "xsum64" attribute */
} cai_ckpt_entry;

typedef struct cai_ckpt_file cai_ckpt_file_t;

/* Open read-only; checks that it is a colossal checkpoint (format
 * attribute) and reads its metadata and dataset list. Collective over comm
 * (MPI_COMM_SELF for one process: then HDF5's POSIX driver reads the file,
 * without MPI-IO). */
cai_status cai_ckpt_open(cai_ckpt_file_t **out, MPI_Comm comm, const char *path);
/* Collective over the comm it was opened with. */
void cai_ckpt_close(cai_ckpt_file_t *f);
const char *cai_ckpt_path(const cai_ckpt_file_t *f);
const cai_ckpt_meta *cai_ckpt_file_meta(const cai_ckpt_file_t *f);
/* Datasets in name order (the config text dataset is not listed). */
int cai_ckpt_count(const cai_ckpt_file_t *f);
const cai_ckpt_entry *cai_ckpt_entry_at(const cai_ckpt_file_t *f, int i);
const cai_ckpt_entry *cai_ckpt_find(const cai_ckpt_file_t *f, const char *name); /* NULL when absent */
/* Root attributes as text, in name order. */
int cai_ckpt_attr_count(const cai_ckpt_file_t *f);
void cai_ckpt_attr_at(const cai_ckpt_file_t *f, int i, const char **key, const char **value);
/* The whole global tensor `name` converted to dtype (F32, BF16 or F16)
 * into dst (numel elements) on every rank. Collective over comm. */
cai_status cai_ckpt_read(cai_ckpt_file_t *f, const char *name, cai_dtype dtype, void *dst);
/* Recompute every dataset's checksum (the work split over comm's ranks)
 * and compare it with the stored one. computed (may be NULL) receives
 * count values in entry order. A mismatch or a missing checksum is
 * CAI_ERR_FORMAT naming the file, the first bad tensor and how many are
 * bad; *n_bad (may be NULL) receives the count. Collective over comm. */
cai_status cai_ckpt_verify(cai_ckpt_file_t *f, uint64_t *computed, int *n_bad);

/* ========================================================= end of checkpoints */

#ifdef __cplusplus
}
#endif
#endif
