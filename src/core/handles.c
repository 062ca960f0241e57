/*
 * handles.c - the set of live objects the library has handed out, so that every *_free,
 * *_destroy and *_close function can tell one of them from anything else: a pointer freed
 * already (a double destroy), one of another type, or one the library never made. Those are
 * ignored instead of freed again. A hash set of addresses under one mutex; the objects themselves
 * are never read to decide (reading freed memory is what a double free must not do).
 */
#include "core/internal.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    uintptr_t key;     /* 0: empty */
    uint8_t kind;      /* 0 with key != 0: a tombstone (removed) */
} slot;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static slot *g_slots;
static size_t g_cap, g_used /* live + tombstones */, g_live;

static size_t hash(uintptr_t k) {
    uint64_t x = (uint64_t)k;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

static slot *find(uintptr_t k) {
    for (size_t i = g_cap ? hash(k) & (g_cap - 1) : 0, n = 0; n < g_cap; i = (i + 1) & (g_cap - 1), n++) {
        if (g_slots[i].key == 0) return NULL;
        if (g_slots[i].key == k && g_slots[i].kind) return &g_slots[i];
    }
    return NULL;
}

static void put(slot *slots, size_t cap, uintptr_t k, uint8_t kind, size_t *used) {
    for (size_t i = hash(k) & (cap - 1);; i = (i + 1) & (cap - 1)) {
        if (slots[i].key == 0 || slots[i].kind == 0) {
            if (slots[i].key == 0) (*used)++;
            slots[i] = (slot){k, kind};
            return;
        }
    }
}

/* Rehashes the live entries into a table at most a quarter full (tombstones dropped). */
static bool grow(void) {
    size_t cap = 64;
    while (cap < 4 * (g_live + 1)) cap *= 2;
    slot *s = calloc(cap, sizeof *s);
    if (!s) return false;
    size_t used = 0;
    for (size_t i = 0; i < g_cap; i++)
        if (g_slots[i].key && g_slots[i].kind) put(s, cap, g_slots[i].key, g_slots[i].kind, &used);
    free(g_slots);
    g_slots = s;
    g_cap = cap;
    g_used = used;
    return true;
}

nvfp4moe_status nvfp4moe_handle_add(const void *p, nvfp4moe_handle_kind kind) {
    pthread_mutex_lock(&g_lock);
    bool ok = 2 * (g_used + 1) <= g_cap || grow();
    if (ok) {
        put(g_slots, g_cap, (uintptr_t)p, (uint8_t)kind, &g_used);
        g_live++;
    }
    pthread_mutex_unlock(&g_lock);
    return ok ? NVFP4MOE_OK : nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory (handle table)");
}

bool nvfp4moe_handle_remove(const void *p, nvfp4moe_handle_kind kind) {
    if (!p) return false;
    pthread_mutex_lock(&g_lock);
    slot *s = find((uintptr_t)p);
    bool live = s && s->kind == (uint8_t)kind;
    if (live) {
        s->kind = 0;
        g_live--;
    }
    pthread_mutex_unlock(&g_lock);
    return live;
}

bool nvfp4moe_handle_live(const void *p, nvfp4moe_handle_kind kind) {
    if (!p) return false;
    pthread_mutex_lock(&g_lock);
    const slot *s = find((uintptr_t)p);
    bool live = s && s->kind == (uint8_t)kind;
    pthread_mutex_unlock(&g_lock);
    return live;
}
