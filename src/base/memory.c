/* Aligned allocation with context, and bump arenas for hot-path scratch. */
#include "cai_config.h"
#include "colossal/base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CAI_DEFAULT_ALIGN 64

cai_status cai_malloc(void **out, size_t bytes, const char *what) {
    *out = NULL;
    if (bytes == 0) return CAI_OK;
    size_t rounded = (bytes + CAI_DEFAULT_ALIGN - 1) / CAI_DEFAULT_ALIGN * CAI_DEFAULT_ALIGN;
    void *p = aligned_alloc(CAI_DEFAULT_ALIGN, rounded);
    if (!p) return CAI_ERROR(CAI_ERR_NOMEM, "cannot allocate %zu bytes for %s", bytes, what ? what : "(unnamed)");
    *out = p;
    return CAI_OK;
}

cai_status cai_calloc(void **out, size_t count, size_t size, const char *what) {
    if (size && count > SIZE_MAX / size)
        return CAI_ERROR(CAI_ERR_NOMEM, "allocation of %zu x %zu bytes for %s overflows", count, size,
                         what ? what : "(unnamed)");
    CAI_CALL(cai_malloc(out, count * size, what));
    if (*out) memset(*out, 0, count * size);
    return CAI_OK;
}

void cai_free(void *ptr) { free(ptr); }

cai_status cai_arena_init(cai_arena_t *arena, size_t capacity, const char *name) {
    memset(arena, 0, sizeof *arena);
    arena->name = name ? name : "arena";
    CAI_CALL(cai_malloc((void **)&arena->base, capacity, arena->name));
    arena->capacity = capacity;
    return CAI_OK;
}

cai_status cai_arena_alloc(cai_arena_t *arena, size_t bytes, size_t align, void **out) {
    if (align == 0) align = CAI_DEFAULT_ALIGN;
    CAI_CHECK_ARG((align & (align - 1)) == 0, "arena alignment %zu is not a power of two", align);
    /* Align the address, not the offset: the base is only 64-byte aligned. */
    uintptr_t addr = (uintptr_t)(arena->base + arena->used);
    size_t start = arena->used + (size_t)(((addr + align - 1) & ~(uintptr_t)(align - 1)) - addr);
    if (start + bytes > arena->capacity)
        return CAI_ERROR(CAI_ERR_NOMEM,
                         "arena '%s' exhausted: %zu bytes requested, %zu of %zu in use "
                         "(raise its size to at least %zu)",
                         arena->name, bytes, arena->used, arena->capacity, start + bytes);
    *out = arena->base + start;
    arena->used = start + bytes;
    if (arena->used > arena->high_water) arena->high_water = arena->used;
    return CAI_OK;
}

size_t cai_arena_mark(const cai_arena_t *arena) { return arena->used; }

void cai_arena_reset_to(cai_arena_t *arena, size_t mark) {
    if (mark <= arena->used) arena->used = mark;
}

void cai_arena_free(cai_arena_t *arena) {
    cai_free(arena->base);
    memset(arena, 0, sizeof *arena);
}
