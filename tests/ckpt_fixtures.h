/*
 * ckpt_fixtures.h - the model directories the checkpoint tests build at test time, and the command
 * line they run: a temporary directory per test program, small quantized layers written in any
 * format, one-tensor edits of a written checkpoint, the two loaders' expected failures, and the
 * CLI (NVFP4MOE_CLI) with its output captured. Header-only, after harness.h.
 */
#ifndef NVFP4MOE_TEST_CKPT_FIXTURES_H
#define NVFP4MOE_TEST_CKPT_FIXTURES_H

#include "harness.h"
#include "nvfp4moe.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* This program's temporary directory (fixtures_begin). */
static char g_dir[256];

/* g_dir/name, created: four results stay valid at once. */
static inline const char *dir_in(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    mkdir(buf[k], 0755);
    return buf[k];
}

/* Writes text to dir/name (exits the test program if it cannot). */
static inline void write_text(const char *dir, const char *name, const char *text) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (!f) {
        perror(p);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
}

/* A small W4A4 layer shape in f32 (E=4, top-2, H=64, I=32). */
static inline nvfp4moe_config small_cfg(void) {
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = 4;
    c.top_k = 2;
    c.hidden_size = 64;
    c.intermediate_size = 32;
    c.in_dtype = c.out_dtype = NVFP4MOE_DTYPE_F32;
    return c;
}

/* Writes layer `layer` of q into dir in format fmt (model of layer+1 layers). */
static inline void save_layer(const char *dir, nvfp4moe_ckpt_format fmt, const nvfp4moe_ckpt_layer *q,
                              int32_t layer) {
    nvfp4moe_st_writer *w = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    CHECK_OK(nvfp4moe_ckpt_add_layer(w, fmt, "model.layers", layer, q, NULL));
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(nvfp4moe_st_writer_save(w, p));
    nvfp4moe_st_writer_free(w);
    CHECK_OK(nvfp4moe_model_config_write(dir, &q->layer.cfg, layer + 1, layer, fmt, NULL,
                                         q->router_name));
}

/* A random float layer of shape cfg, quantized the ModelOpt way (16 calibration tokens). */
static inline nvfp4moe_ckpt_layer *make_quantized(const nvfp4moe_config *cfg, uint64_t seed) {
    nvfp4moe_float_layer *f = NULL;
    nvfp4moe_ckpt_layer *q = NULL;
    CHECK_OK(nvfp4moe_float_layer_random(cfg, seed, &f));
    if (f) CHECK_OK(nvfp4moe_float_layer_quantize(f, 16, seed, &q));
    nvfp4moe_float_layer_free(f);
    return q;
}

/* One change rewrite() makes to a checkpoint: drop a tensor, replace it, or add a new one. */
typedef struct {
    const char *name;       /* tensor to change ("" none) */
    int action;             /* 0 drop, 1 replace, 2 add (after the file's own tensors) */
    nvfp4moe_st_dtype dtype;
    int32_t ndim;
    int64_t shape[3];
    const void *data;
} edit;

/* Copies src_dir's model.safetensors + config into dst_dir, applying the edits. */
static inline void rewrite(const char *src_dir, const char *dst_dir, const edit *edits, int n) {
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", src_dir);
    nvfp4moe_st_file *f = NULL;
    CHECK_OK(nvfp4moe_st_open(p, &f));
    nvfp4moe_st_writer *w = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    for (size_t i = 0; f && i < nvfp4moe_st_file_count(f); i++) {
        const nvfp4moe_st_tensor *t = nvfp4moe_st_file_tensor(f, i);
        const edit *ed = NULL;
        for (int k = 0; k < n; k++)
            if (!strcmp(edits[k].name, t->name)) ed = &edits[k];
        if (ed && ed->action == 0) continue;
        if (ed) CHECK_OK(nvfp4moe_st_writer_add(w, t->name, ed->dtype, ed->ndim, ed->shape, ed->data));
        else CHECK_OK(nvfp4moe_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data));
    }
    nvfp4moe_st_close(f);
    for (int k = 0; k < n; k++)
        if (edits[k].action == 2)
            CHECK_OK(nvfp4moe_st_writer_add(w, edits[k].name, edits[k].dtype, edits[k].ndim, edits[k].shape,
                                            edits[k].data));
    snprintf(p, sizeof p, "%s/model.safetensors", dst_dir);
    CHECK_OK(nvfp4moe_st_writer_save(w, p));
    nvfp4moe_st_writer_free(w);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "cp '%s'/*.json '%s'/", src_dir, dst_dir);
    CHECK(system(cmd) == 0, "copy configs");
}

/* Writes float layer f as layer 0 of an unquantized (BF16) model in dir, with its config.json. */
static inline void write_float_model(const char *dir, const nvfp4moe_config *cfg, const nvfp4moe_float_layer *f) {
    nvfp4moe_st_writer *w = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    CHECK_OK(nvfp4moe_ckpt_add_layer(w, NVFP4MOE_CKPT_UNQUANTIZED, "model.layers", 0, NULL, f));
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(nvfp4moe_st_writer_save(w, p));
    nvfp4moe_st_writer_free(w);
    CHECK_OK(nvfp4moe_model_config_write(dir, cfg, 1, 0, NVFP4MOE_CKPT_UNQUANTIZED, NULL, NULL));
}

/* Loading layer 0 of dir fails with st and a message containing needle, writing no layer: through
 * the full load and through the check-only path (inspect), which must report the same problem. */
static inline void ckpt_load_fails(const char *dir, nvfp4moe_status st, const char *needle) {
    nvfp4moe_ckpt_layer *l = NULL;
    CHECK_ERR(nvfp4moe_ckpt_layer_load(dir, 0, &l), st, needle);
    CHECK(l == NULL, "output written on failure");
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_st_model *m = NULL;
    CHECK_OK(nvfp4moe_model_info_read(dir, &info));
    CHECK_OK(nvfp4moe_st_model_open(dir, &m));
    if (info && m) CHECK_ERR(nvfp4moe_ckpt_layer_load_from(info, m, 0, true, &l), st, needle);
    CHECK(l == NULL, "output written on failure (check-only)");
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
}

/* The float loader (the source of quantize --in) fails on layer 0 of dir the same way. */
static inline void float_load_fails(const char *dir, nvfp4moe_status st, const char *needle) {
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_st_model *m = NULL;
    nvfp4moe_float_layer *g = NULL;
    CHECK_OK(nvfp4moe_model_info_read(dir, &info));
    CHECK_OK(nvfp4moe_st_model_open(dir, &m));
    if (info && m) CHECK_ERR(nvfp4moe_float_layer_load(info, m, 0, &g), st, needle);
    CHECK(g == NULL, "output written on failure");
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
}

/* What the last cli() call printed (stdout and stderr). */
static char g_out[16384];

/* Runs the CLI with args (a shell fragment), capturing stdout+stderr in g_out; returns the exit
 * status. */
static inline int cli(const char *fmt, ...) {
    char args[2048], cmd[2600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", getenv("NVFP4MOE_CLI"), args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(g_out, 1, sizeof g_out - 1, p);
    g_out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The test program's temporary directory (under /tmp, named after the program), made once. */
static inline void fixtures_begin(const char *program) {
    snprintf(g_dir, sizeof g_dir, "/tmp/%s-XXXXXX", program);
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        exit(2);
    }
}

/* Removes the temporary directory and everything in it. */
static inline void fixtures_end(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

// Sanitizers reserve terabytes of address space: an address-space limit cannot apply under them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

/* Runs fn in a child process (its own process group, with whatever it starts) limited to `seconds`
 * of wall time and, outside sanitizer builds, `mib` MiB of address space, so that a hang or a
 * runaway allocation fails the case instead of stalling the suite or the machine; the group is
 * killed when time runs out. The child's own checks decide its exit status. */
static inline void bounded(const char *what, void (*fn)(void), unsigned seconds, long mib) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
#ifndef UNDER_SANITIZER
        struct rlimit rl = {(rlim_t)mib << 20, (rlim_t)mib << 20};
        setrlimit(RLIMIT_AS, &rl);
#else
        (void)mib;
#endif
        t_passed = t_failed = 0;
        fn();
        fflush(NULL);
        _exit(t_failed ? 1 : 0);
    }
    if (pid < 0) {
        CHECK(false, "%s: fork failed", what);
        return;
    }
    setpgid(pid, pid);   // also here: the kill below must not race the child's own call
    int st = 0;
    bool done = false;
    for (unsigned ms = 0; ms < seconds * 1000u && !done; ms += 10) {
        done = waitpid(pid, &st, WNOHANG) == pid;
        if (!done) usleep(10000);
    }
    kill(-pid, SIGKILL);   // the child if it is still running, and anything it started
    if (!done) waitpid(pid, &st, 0);
    if (!done)
        CHECK(false, "%s: did not finish in %u s (a hang or a runaway computation)", what, seconds);
    else if (WIFSIGNALED(st))
        CHECK(false, "%s: %s", what, strsignal(WTERMSIG(st)));
    else
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: exit status %d", what, WEXITSTATUS(st));
}

#endif // NVFP4MOE_TEST_CKPT_FIXTURES_H
