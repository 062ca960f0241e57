/*
 * fuzz_cli.c - libFuzzer target: the command line. The input is the arguments, separated by NUL
 * bytes; the first picks the subcommand (select, inspect, run, quantize or compare, by name or by
 * its first byte). "@MODEL" stands for a small NVFP4 checkpoint, "@SRC" for its BF16 source, "@RUN"
 * for a `run --output` file of the checkpoint's first layer and "@OUT" for a scratch output
 * directory, all made once per process; each may also stand after "=" ("--model=@MODEL"). Each run
 * starts in an empty scratch working directory, and inputs that could write elsewhere are skipped:
 * an absolute path, "..", or the fixtures as --out or --output (also after "="). Every run must
 * return an exit status of the CLI's (0-3) without crashing. Inputs with a number above 64 are
 * skipped (also after "="): they ask for large layers or many ranks, which is slow, not wrong; for
 * the same reason `run` without --model starts from a small shape (E=4, top-2, H=32, I=16, 2
 * tokens), which the input's flags may change. `make fuzz` runs it with tests/fuzz/corpus/cli and
 * cli.dict and -close_fd_mask=3 (the commands' output is dropped; libFuzzer keeps its own).
 */
#include "fuzz_util.h"

#include "tools/cli.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_model[128], g_src[128], g_run[128], g_out[128], g_work[128];

static void setup(void) {
    if (g_model[0]) return;
    const char *d = fuzz_dir();
    snprintf(g_src, sizeof g_src, "%s/src", d);
    snprintf(g_model, sizeof g_model, "%s/model", d);
    snprintf(g_run, sizeof g_run, "%s/run.safetensors", d);
    snprintf(g_out, sizeof g_out, "%s/out", d);
    snprintf(g_work, sizeof g_work, "%s/work", d);
    char *a1[] = {"quantize", "--random", "--num-experts", "4", "--top-k", "2", "--hidden-size", "32",
                  "--intermediate-size", "16", "--out", g_src, NULL};
    char *a2[] = {"quantize", "--in", g_src, "--out", g_model, NULL};
    char *a3[] = {"run", "--model", g_model, "--tokens", "2", "--output", g_run, NULL};
    if (cmd_quantize(12, a1) != 0 || cmd_quantize(5, a2) != 0 || cmd_run(7, a3) != 0) abort();
}

/* The fixture a placeholder names, or NULL. */
static const char *fixture(const char *a) {
    return !strcmp(a, "@MODEL") ? g_model : !strcmp(a, "@SRC") ? g_src : !strcmp(a, "@RUN") ? g_run
           : !strcmp(a, "@OUT") ? g_out : NULL;
}

/* Whether an argument could make a run write outside the scratch directory (or over a fixture). */
static bool escapes(const char *a, const char *prev) {
    const char *eq = a[0] == '-' ? strchr(a, '=') : NULL;
    const char *value = eq ? eq + 1 : a;
    if (value[0] == '/' || strstr(a, "..")) return true;
    const bool writes = eq ? !strncmp(a, "--out=", 6) || !strncmp(a, "--output=", 9)
                           : prev && (!strcmp(prev, "--out") || !strcmp(prev, "--output"));
    return writes && fixture(value) && strcmp(value, "@OUT");
}

/* Whether s (or the value of --flag=s) is a whole number above 64 (a large layer, many tokens or
 * ranks). */
static int too_big(const char *s) {
    if (s[0] == '-' && strchr(s, '=')) s = strchr(s, '=') + 1;
    const char *p = s + (*s == '-' || *s == '+');
    if (!*p) return 0;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return 0;
    return strlen(p) > 2 || atoi(p) > 64;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    if (size == 0 || size > 4096) return 0;
    char *buf = malloc(size + 1);
    char *argv[80];
    static char expanded[60][160];   /* "--flag=@FIXTURE" with the fixture's path */
    int argc = 0;
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (size_t i = 0; i <= size && argc < 60;) {
        char *a = buf + i;
        size_t n = strlen(a);
        if (too_big(a) || escapes(a, argc ? argv[argc - 1] : NULL)) {
            free(buf);
            return 0;
        }
        const char *eq = a[0] == '-' ? strchr(a, '=') : NULL;
        if (fixture(a)) {
            a = (char *)fixture(a);
        } else if (eq && fixture(eq + 1)) {
            snprintf(expanded[argc], sizeof expanded[argc], "%.*s=%s", (int)(eq - a > 60 ? 60 : eq - a), a,
                     fixture(eq + 1));
            a = expanded[argc];
        }
        argv[argc++] = a;
        i += n + 1;
    }
    argv[argc] = NULL;
    static int (*const k_cmds[])(int, char **) = {cmd_select, cmd_inspect, cmd_run, cmd_quantize, cmd_compare};
    static const char *const k_names[] = {"select", "inspect", "run", "quantize", "compare"};
    int which = (unsigned char)argv[0][0] % 5;
    for (int k = 0; k < 5; k++)
        if (!strcmp(argv[0], k_names[k])) which = k;
    argv[0] = (char *)k_names[which];
    bool model = false;
    for (int i = 1; i < argc; i++) model |= !strcmp(argv[i], "--model") || !strncmp(argv[i], "--model=", 8);
    if (which == 2 && !model) {   // run: a small default layer, before the input's own flags
        static char *const k_small[] = {"--num-experts", "4", "--top-k", "2", "--hidden-size", "32",
                                        "--intermediate-size", "16", "--tokens", "2"};
        const int n = (int)(sizeof k_small / sizeof k_small[0]);
        memmove(argv + 1 + n, argv + 1, sizeof *argv * (size_t)argc);
        memcpy(argv + 1, k_small, sizeof k_small);
        argc += n;
    }
    fuzz_rm_tree(g_out);
    fuzz_rm_tree(g_work);   // relative paths land here, in a fresh directory each run
    if (mkdir(g_work, 0755) != 0 || chdir(g_work) != 0) abort();
    int rc = k_cmds[which](argc, argv);
    if (chdir(fuzz_dir()) != 0) abort();
    if (rc < 0 || rc > 3) abort();
    free(buf);
    return 0;
}
