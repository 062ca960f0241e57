/*
 * harness.h - the test harness of every test program, CPU (tests/test_*.c) and GPU
 * (tests/gpu_*.c): checks that count, print the case and the first mismatches, and a closing
 * "<suite>: N passed, N failed" line (t_finish) that tests/run_all.sh sums. Checks run on one
 * thread; a program whose cases run on several threads and print their own log records each
 * case's verdict with t_record. Header-only; each test file is one program.
 */
#ifndef NVFP4MOE_TEST_HARNESS_H
#define NVFP4MOE_TEST_HARNESS_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvfp4moe.h"

static int t_passed, t_failed;
static const char *t_case = "";

#define T_CASE(name) (t_case = (name))

/* Counts one case whose verdict the caller decided (and printed): thread-safe. */
static pthread_mutex_t t_lock = PTHREAD_MUTEX_INITIALIZER;
static inline void t_record(int ok) {
    pthread_mutex_lock(&t_lock);
    if (ok) t_passed++;
    else t_failed++;
    pthread_mutex_unlock(&t_lock);
}

/* A CUDA runtime call that must succeed for the test program to go on (GPU tests): the error, the
 * call and where, then exit status 2. */
#define CUDA_OK(expr)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__,      \
                    __LINE__, #expr);                                                              \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            t_passed++;                                                                            \
        } else {                                                                                   \
            t_failed++;                                                                            \
            fprintf(stderr, "FAIL %s:%d [%s] %s: ", __FILE__, __LINE__, t_case, #cond);            \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* Checks a library call returned OK, printing the library's message otherwise. */
#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        nvfp4moe_status s_ = (expr);                                                               \
        CHECK(s_ == NVFP4MOE_OK, "%s -> %s: %s", #expr, nvfp4moe_status_str(s_),                   \
              nvfp4moe_last_error());                                                              \
    } while (0)

/* Checks expr failed with status st and that the message contains needle. */
#define CHECK_ERR(expr, st, needle)                                                                \
    do {                                                                                           \
        nvfp4moe_status s_ = (expr);                                                               \
        CHECK(s_ == (st) && strstr(nvfp4moe_last_error(), (needle)) != NULL,                       \
              "%s -> %s \"%s\", want %s containing \"%s\"", #expr, nvfp4moe_status_str(s_),        \
              nvfp4moe_last_error(), nvfp4moe_status_str(st), (needle));                           \
    } while (0)

/* FNV-1a 64 of n bytes (the tool's output checksum, `nvfp4moe run`): tests compare outputs by it. */
static inline uint64_t t_fnv1a(const void *p, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001B3ull;
    return h;
}

/* Bitwise comparison of two byte arrays; prints the first mismatches. */
static inline int check_bytes(const char *what, const uint8_t *got, const uint8_t *want, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            if (bad < 5)
                fprintf(stderr, "  [%s] %s: byte %zu got 0x%02x want 0x%02x\n", t_case, what, i,
                        got[i], want[i]);
            bad++;
        }
    }
    if (bad) {
        fprintf(stderr, "FAIL [%s] %s: %d of %zu bytes differ\n", t_case, what, bad, n);
        t_failed++;
    } else {
        t_passed++;
    }
    return bad == 0;
}

/* ||got - want|| / ||want|| over n values (want in double); prints the case and the worst
 * elements when it exceeds tol. NaN never passes. Returns the error. */
static inline double check_rel_l2(const char *what, const float *got, const double *want, size_t n,
                                  double tol) {
    double num = 0, den = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isinf(got[i])) nan++;
        double d = (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    double err = den > 0 ? sqrt(num / den) : sqrt(num);
    if (nan || !(err <= tol)) {
        fprintf(stderr, "FAIL [%s] %s: rel err %.3g > %.3g (%d non-finite of %zu)\n", t_case, what,
                err, tol, nan, n);
        int shown = 0;
        for (size_t i = 0; i < n && shown < 5; i++) {
            double d = fabs((double)got[i] - want[i]);
            if (isnan(got[i]) || d > tol * (fabs(want[i]) + 1e-3)) {
                fprintf(stderr, "  [%zu] got %.6g want %.6g\n", i, (double)got[i], want[i]);
                shown++;
            }
        }
        t_failed++;
    } else {
        t_passed++;
    }
    return err;
}

/* The CPU as a device. */
static inline nvfp4moe_device t_cpu(void) {
    nvfp4moe_device d;
    nvfp4moe_device_parse("cpu", &d);
    return d;
}

/* Runs cfg on a host backend through the plan API (threads: the plan's num_threads, 0 for the
 * default) with in's tensors, the output poisoned with NaN first; got: the output as float. */
static inline nvfp4moe_status t_run_host(const char *backend, const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                         const nvfp4moe_io *in, int32_t threads, float *got) {
    nvfp4moe_device dev = t_cpu();
    nvfp4moe_plan_options po = {.backend = backend, .device = &dev, .num_threads = threads};
    nvfp4moe_plan *plan = NULL;
    nvfp4moe_status st = nvfp4moe_plan_create(cfg, w, &po, &plan);
    if (st != NVFP4MOE_OK) return st;
    size_t osz = nvfp4moe_dtype_size(cfg->out_dtype), n = (size_t)(in->num_tokens * cfg->hidden_size);
    void *out = malloc(n * osz + 1);
    memset(out, 0xFF, n * osz); /* NaN in every dtype */
    nvfp4moe_io io = *in;
    io.output = out;
    st = nvfp4moe_plan_forward(plan, &io, NULL);
    if (st == NVFP4MOE_OK) nvfp4moe_to_float(cfg->out_dtype, out, (int64_t)n, got);
    free(out);
    nvfp4moe_plan_destroy(plan);
    return st;
}

static inline int t_finish(const char *suite) {
    printf("%s: %d passed, %d failed\n", suite, t_passed, t_failed);
    return t_failed ? 1 : 0;
}

#endif // NVFP4MOE_TEST_HARNESS_H
