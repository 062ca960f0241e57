/*
 * fuzz_util.h - what the libFuzzer targets of tests/fuzz/ share: a private temporary directory per
 * fuzzing process, whole-file writes into it, and the library's errors checked for what every
 * failure must carry (a status that is not OK, and a message). Header-only.
 */
#ifndef NVFP4MOE_FUZZ_UTIL_H
#define NVFP4MOE_FUZZ_UTIL_H

#define _GNU_SOURCE   // nftw's FTW_PHYS
#include "nvfp4moe.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* This process's scratch directory, made on first use and removed at exit. */
static char g_fuzz_dir[64];

static int fuzz_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* rm -rf path (never following links). */
static inline void fuzz_rm_tree(const char *path) { nftw(path, fuzz_rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static void fuzz_cleanup(void) {
    if (g_fuzz_dir[0]) fuzz_rm_tree(g_fuzz_dir);
}

static inline const char *fuzz_dir(void) {
    if (!g_fuzz_dir[0]) {
        snprintf(g_fuzz_dir, sizeof g_fuzz_dir, "/tmp/nvfp4moe-fuzz-XXXXXX");
        if (!mkdtemp(g_fuzz_dir)) abort();
        atexit(fuzz_cleanup);
    }
    return g_fuzz_dir;
}

/* Writes n bytes to dir/name (replacing it); aborts if the file system refuses (not a finding). */
static inline void fuzz_write(const char *dir, const char *name, const void *data, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) abort();
}

/* A failed call must say so with a known status and a message: anything else is a finding. */
static inline void fuzz_check_failure(nvfp4moe_status s) {
    if (s == NVFP4MOE_OK) return;
    if ((int)s < 0 || (int)s > NVFP4MOE_ERR_INTERNAL || s == NVFP4MOE_ERR_INTERNAL || !nvfp4moe_last_error()[0]) {
        fprintf(stderr, "bad failure: status %d (%s), message \"%s\"\n", (int)s, nvfp4moe_status_str(s),
                nvfp4moe_last_error());
        abort();
    }
}

#endif // NVFP4MOE_FUZZ_UTIL_H
