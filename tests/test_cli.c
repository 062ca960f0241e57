/*
 * test_cli.c - the command line as a user meets it, through the built binary ($NVFP4MOE_CLI):
 * getopt_long's conventions in every subcommand (--flag=value, --flag value, -h, "--", flags and
 * operands in any order, no abbreviations), --help laid out in columns, "did you mean" for flags,
 * subcommands, backends, devices and presets, `run --device` refusing a GPU that is not here,
 * `select --model` warning about an unquantized model, `run`'s outputs and input files (hidden
 * states, router logits, top-k ids and weights), --json on run, inspect and bench, bench creating
 * its output folder and writing JSON lines, bench's hot-expert routing (--hot-tokens), and
 * `compare`'s figures, verdicts and exit status.
 */
#include "ckpt_fixtures.h"
#include "reference/reference.h"

#include <dirent.h>
#include <jansson.h>

/* Small layers: E=8, top-2, H=64, I=32. */
#define SHAPE "--num-experts 8 --top-k 2 --hidden-size 64 --intermediate-size 32"

/* What the last cli_stdout() call printed on stdout alone. */
static char g_stdout[65536];

/* Runs the CLI with args, keeping stdout only (stderr dropped); returns the exit status. */
static int cli_stdout(const char *fmt, ...) {
    char args[2048], cmd[2600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>/dev/null", getenv("NVFP4MOE_CLI"), args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(g_stdout, 1, sizeof g_stdout - 1, p);
    g_stdout[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The line of g_out that starts with key ("" if none). */
static const char *line_of(const char *key, char *buf, size_t len) {
    buf[0] = '\0';
    for (const char *p = g_out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, key, strlen(key))) {
            snprintf(buf, len, "%.*s", (int)strcspn(p, "\n"), p);
            break;
        }
    return buf;
}

/* A JSON string's value, "" when it is not one. */
static const char *jstr(const json_t *j) { return json_is_string(j) ? json_string_value(j) : ""; }

/* How many entries of dir hold `part` in their name. */
static int entries_of(const char *dir, const char *part) {
    DIR *dd = opendir(dir);
    int n = 0;
    for (struct dirent *e; dd && (e = readdir(dd));) n += strstr(e->d_name, part) != NULL;
    if (dd) closedir(dd);
    return n;
}

static json_t *parse_json(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    CHECK(j != NULL, "not JSON (%s at line %d): %.300s", e.text, e.line, text);
    return j;
}

/* A tensor of a safetensors file, its bytes copied (NULL if absent); *t its header. */
static uint8_t *tensor_bytes(const char *path, const char *name, nvfp4moe_st_tensor *t) {
    nvfp4moe_st_file *f = NULL;
    if (nvfp4moe_st_open(path, &f) != NVFP4MOE_OK) return NULL;
    const nvfp4moe_st_tensor *x = nvfp4moe_st_file_find(f, name);
    uint8_t *b = x ? malloc((size_t)x->nbytes + 1) : NULL;
    if (b && nvfp4moe_st_tensor_read(x, 0, x->nbytes, b) != NVFP4MOE_OK) {
        free(b);
        b = NULL;
    }
    if (x && t) *t = *x;
    nvfp4moe_st_close(f);
    return b;
}

static char *meta_of(const char *path, const char *key, char *buf, size_t len) {
    nvfp4moe_st_file *f = NULL;
    buf[0] = '\0';
    if (nvfp4moe_st_open(path, &f) == NVFP4MOE_OK && nvfp4moe_st_file_metadata(f, key))
        snprintf(buf, len, "%s", nvfp4moe_st_file_metadata(f, key));
    nvfp4moe_st_close(f);
    return buf;
}

/* Writes one-tensor-or-more safetensors file path. */
static void write_st(const char *path, int n, const char *const *names, const nvfp4moe_st_dtype *dt,
                     const int64_t (*shapes)[2], const void *const *data) {
    nvfp4moe_st_writer *w = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    for (int i = 0; i < n; i++) CHECK_OK(nvfp4moe_st_writer_add(w, names[i], dt[i], 2, shapes[i], data[i]));
    CHECK_OK(nvfp4moe_st_writer_save(w, path));
    nvfp4moe_st_writer_free(w);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(p, 1, n, f) == n, "writing %s", path);
    if (f) fclose(f);
}

// ---- the conventions ----

/* A help text's flag lines: the description of every flag starts in the help column (28), or on
 * the next line when the flag is too long, never run into the flag's name; continuation lines are
 * indented to the column. Returns the number of flag lines checked. */
static int check_help_columns(const char *what, const char *text) {
    int flags = 0;
    bool in_desc = false;   /* the previous line was a flag line: a continuation may follow */
    for (const char *p = text; *p;) {
        const size_t len = strcspn(p, "\n");
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)len, p);
        p += len + (p[len] == '\n');
        if (!strncmp(line, "  -", 3)) {
            flags++;
            /* the flag and its placeholder: "  --name" then at most " ARG" (no spaces in it) */
            const char *q = line + 2;
            q += strcspn(q, " ");
            if (*q == ' ' && q[1] != ' ') q += 1 + strcspn(q + 1, " ");
            const size_t lhs = (size_t)(q - line);
            if (!*q) {   /* alone on its line: the help follows on the next, at the column */
                CHECK(*p && strspn(p, " ") == 28, "[%s] '%s': its help is not on the next line at column 28", what,
                      line);
            } else {
                const size_t desc = lhs + strspn(q, " ");
                CHECK(desc == 28 && lhs + 2 <= 28, "[%s] '%s': help starts at column %zu, not 28", what, line, desc);
            }
            in_desc = true;
        } else if (in_desc && line[0] == ' ' && strspn(line, " ") >= 4) {
            CHECK(strspn(line, " ") == 28 || strspn(line, " ") > 28, "[%s] continuation '%s' not at column 28", what,
                  line);
        } else {
            in_desc = false;
        }
    }
    return flags;
}

static void test_help(void) {
    T_CASE("--help of every subcommand, in columns");
    static const char *const cmds[] = {"run", "select", "inspect", "quantize", "compare", "bench", "bench --cpu",
                                       "bench --ep 2"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        int rc = cli_stdout("%s --help", cmds[i]);
        CHECK(rc == 0 && strstr(g_stdout, "usage: nvfp4moe"), "%s --help: rc %d: %.200s", cmds[i], rc, g_stdout);
        const int n = check_help_columns(cmds[i], g_stdout);
        CHECK(n >= 3, "%s --help: %d flag lines", cmds[i], n);
        static char h[sizeof g_stdout];
        memcpy(h, g_stdout, sizeof h);
        rc = cli_stdout("%s -h", cmds[i]);
        CHECK(rc == 0 && !strcmp(h, g_stdout), "%s -h differs from --help", cmds[i]);
    }
    int rc = cli_stdout("run --help");
    CHECK(strstr(g_stdout, "\n  --routed-scaling-factor F\n                            multiplies") &&
              strstr(g_stdout, "\n  --apply-router-weight-on-input\n                            multiply") &&
              strstr(g_stdout, "\n  --router-logits-dtype NAME\n                            bf16"),
          "the long config flags: %.100s", strstr(g_stdout, "--routed") ? strstr(g_stdout, "--routed") : "none");
    rc = cli_stdout("help compare");
    CHECK(rc == 0 && strstr(g_stdout, "usage: nvfp4moe compare"), "help compare: rc %d", rc);
    rc = cli_stdout("--help");
    CHECK(rc == 0 && strstr(g_stdout, "  compare ") && strstr(g_stdout, "--flag=value"), "nvfp4moe --help");
}

static void test_flag_forms(void) {
    T_CASE("--flag=value and --flag value give the same run");
    char a[256], b[256];
    int rc = cli("run " SHAPE " --tokens 3 --seed 4 --moe-backend cpu_fast");
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    line_of("checksum", a, sizeof a);
    rc = cli("run --num-experts=8 --top-k=2 --hidden-size=64 --intermediate-size=32 --tokens=3 --seed=4 "
             "--moe-backend=cpu_fast");
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    line_of("checksum", b, sizeof b);
    CHECK(a[0] && !strcmp(a, b), "'%s' vs '%s'", a, b);
    rc = cli("select --moe-backend=marlin --device=h200");
    CHECK(rc == 0 && strstr(g_out, "backend:  MARLIN"), "rc %d: %s", rc, g_out);
    rc = cli("select --json --device h200 --vllm-only");
    CHECK(rc == 0 && strstr(g_out, "\"backend\": \"MARLIN\""), "rc %d: %.300s", rc, g_out);

    T_CASE("operands anywhere, and after --");
    const char *m = dir_in("forms_model");
    rc = cli("quantize --random " SHAPE " --out %s/src", m);
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    rc = cli("quantize --in %s/src --out %s/q", m, m);
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    rc = cli("inspect --layer 0 %s/q", m);
    CHECK(rc == 0 && strstr(g_out, "layer 0       ok"), "rc %d: %s", rc, g_out);
    rc = cli("inspect %s/q --layer=0", m);
    CHECK(rc == 0 && strstr(g_out, "layer 0       ok"), "rc %d: %s", rc, g_out);
    rc = cli("inspect -- %s/q", m);
    CHECK(rc == 0 && strstr(g_out, "0 problems"), "rc %d: %s", rc, g_out);
    rc = cli("inspect %s/q %s/q", m, m);
    CHECK(rc == 1 && strstr(g_out, "unexpected argument"), "rc %d: %s", rc, g_out);
    rc = cli("inspect");
    CHECK(rc == 1 && strstr(g_out, "needs the model directory"), "rc %d: %s", rc, g_out);

    T_CASE("values: missing, a flag instead, given to a switch, empty");
    rc = cli("run --tokens");
    CHECK(rc == 1 && strstr(g_out, "--tokens needs a value"), "rc %d: %s", rc, g_out);
    rc = cli("run --model --tokens 3");
    CHECK(rc == 1 && strstr(g_out, "--model needs a value") && strstr(g_out, "is a flag"), "rc %d: %s", rc, g_out);
    rc = cli("select --json=yes");
    CHECK(rc == 1 && strstr(g_out, "--json is a switch and takes no value"), "rc %d: %s", rc, g_out);
    rc = cli("run --tokens=");
    CHECK(rc == 1 && strstr(g_out, "--tokens needs a value"), "rc %d: %s", rc, g_out);
    rc = cli("run --swiglu-limit -7");
    CHECK(rc == 1 && strstr(g_out, "swiglu_limit=-7"), "a negative value is a value: rc %d: %s", rc, g_out);
    rc = cli("run stray");
    CHECK(rc == 1 && strstr(g_out, "unexpected argument 'stray'"), "rc %d: %s", rc, g_out);
}

static void test_did_you_mean(void) {
    T_CASE("did you mean: flags, no abbreviations");
    int rc = cli("run --tokns 3");
    CHECK(rc == 1 && strstr(g_out, "unknown flag '--tokns'; did you mean '--tokens'?"), "rc %d: %s", rc, g_out);
    rc = cli("run --tok 3");
    CHECK(rc == 1 && strstr(g_out, "unknown flag '--tok'"), "an abbreviation: rc %d: %s", rc, g_out);
    rc = cli("run -tokens 3");
    CHECK(rc == 1 && strstr(g_out, "did you mean '--tokens'?"), "rc %d: %s", rc, g_out);
    rc = cli("select --hidden 2048");
    CHECK(rc == 1 && strstr(g_out, "did you mean '--hidden-size'?"), "rc %d: %s", rc, g_out);
    rc = cli("select --vllm-onyl");
    CHECK(rc == 1 && strstr(g_out, "did you mean '--vllm-only'?"), "rc %d: %s", rc, g_out);
    rc = cli("inspect --layr 1 x");
    CHECK(rc == 1 && strstr(g_out, "did you mean '--layer'?"), "rc %d: %s", rc, g_out);
    rc = cli("quantize --frmat modelopt");
    CHECK(rc == 1 && strstr(g_out, "did you mean '--format'?"), "rc %d: %s", rc, g_out);
    rc = cli("bench --cpu --thread 1");
    CHECK(rc == 1 && strstr(g_out, "did you mean '--threads'?"), "rc %d: %s", rc, g_out);
    rc = cli("bench --itres 3");
    CHECK(rc == 1 && strstr(g_out, "did you mean '--iters'?"), "rc %d: %s", rc, g_out);
    rc = cli("run --frobnicate");
    CHECK(rc == 1 && strstr(g_out, "unknown flag '--frobnicate' (") && !strstr(g_out, "did you mean"),
          "nothing near: rc %d: %s", rc, g_out);

    T_CASE("did you mean: subcommands");
    rc = cli("selct");
    CHECK(rc == 1 && strstr(g_out, "unknown command 'selct'; did you mean 'select'?"), "rc %d: %s", rc, g_out);
    rc = cli("comapre a b");
    CHECK(rc == 1 && strstr(g_out, "did you mean 'compare'?"), "rc %d: %s", rc, g_out);
    rc = cli("--verison");
    CHECK(rc == 1 && strstr(g_out, "did you mean '--version'?"), "rc %d: %s", rc, g_out);

    T_CASE("did you mean: backends, devices, presets, names");
    rc = cli("select --moe-backend marlinn --device h200");
    CHECK(rc == 2 && strstr(g_out, "ValueError: moe_backend='marlinn' is not supported") &&
              strstr(g_out, "note:     did you mean moe_backend='marlin'?"),
          "rc %d: %s", rc, g_out);
    rc = cli_stdout("select --moe-backend cpu-fats --device cpu --json");
    CHECK(rc == 2 && strstr(g_stdout, "\"detail\": \"did you mean moe_backend='cpu_fast'?\""), "rc %d: %.400s", rc,
          g_stdout);
    rc = cli("run " SHAPE " --moe-backend cpu_refrence --tokens 1");
    CHECK(rc == 1 && strstr(g_out, "did you mean moe_backend='cpu_reference'?"), "rc %d: %s", rc, g_out);
    rc = cli("select --device h2000");
    CHECK(rc == 1 && strstr(g_out, "unknown device 'h2000'") && strstr(g_out, "did you mean 'h200'?"), "rc %d: %s", rc,
          g_out);
    rc = cli("run --device rtx4900");
    CHECK(rc == 1 && strstr(g_out, "did you mean 'rtx4090'?"), "rc %d: %s", rc, g_out);
    rc = cli("select --installed flashinfr");
    CHECK(rc == 1 && strstr(g_out, "did you mean 'flashinfer'?"), "rc %d: %s", rc, g_out);
    rc = cli("select --activation swigluaoi");
    CHECK(rc == 1 && strstr(g_out, "did you mean 'swigluoai'?"), "rc %d: %s", rc, g_out);
    rc = cli("bench --cpu --preset qwen3-30b");
    CHECK(rc == 1 && strstr(g_out, "unknown preset 'qwen3-30b'; did you mean 'qwen3-30b-a3b'?"), "rc %d: %s", rc,
          g_out);
    rc = cli("bench --preset deepseek-v2 --help");
    CHECK(rc == 1 && strstr(g_out, "did you mean 'deepseek-v3'?"), "rc %d: %s", rc, g_out);
}

/* `run --device` names the device it runs on: a GPU that is not in this machine only plans. */
static void test_no_gpu(void) {
    nvfp4moe_device d;
    nvfp4moe_device_detect(&d);
    if (d.is_cuda) {
        printf("test_cli: a GPU is present (%s): the no-GPU messages are not checked here\n", d.name);
        return;
    }
    T_CASE("run --device h200 without a GPU");
    int rc = cli("run " SHAPE " --device h200");
    CHECK(rc == 1 && strstr(g_out, "nvfp4moe run: --device h200: no GPU here: --device only plans (see select)") &&
              !strstr(g_out, "layer "),
          "rc %d: %s", rc, g_out);
    rc = cli("run " SHAPE " --device sm_100 --tokens 1");
    CHECK(rc == 1 && strstr(g_out, "no GPU here"), "rc %d: %s", rc, g_out);
    rc = cli("run " SHAPE " --device cpu --tokens 1");
    CHECK(rc == 0 && strstr(g_out, "device    cpu"), "rc %d: %s", rc, g_out);
    rc = cli("run " SHAPE " --device h200 --ep 2 --tokens 2");
    CHECK(rc == 0 && strstr(g_out, "loopback simulation"), "--ep still simulates: rc %d: %s", rc, g_out);
}

static void test_select_unquantized(void) {
    T_CASE("select --model of an unquantized model warns what it plans");
    const char *m = dir_in("unq");
    int rc = cli("quantize --random " SHAPE " --out %s/src", m);
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    rc = cli("quantize --in %s/src --out %s/q", m, m);
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    rc = cli("select --model %s/src --device h200", m);
    CHECK(rc == 0 && strstr(g_out, "warning: ") && strstr(g_out, "is not quantized") &&
              strstr(g_out, "planning w4a4") && strstr(g_out, "--scheme w4a16"),
          "rc %d: %s", rc, g_out);
    rc = cli("select --model %s/src --device h200 --scheme w4a16", m);
    CHECK(rc == 0 && strstr(g_out, "planning w4a16") && !strstr(g_out, "(--scheme w4a16"), "rc %d: %s", rc, g_out);
    rc = cli("select --model %s/q --device h200", m);
    CHECK(rc == 0 && !strstr(g_out, "warning"), "a quantized model: rc %d: %s", rc, g_out);
}

// ---- run's files ----

static void test_run_output(void) {
    T_CASE("run --output: safetensors and raw");
    const char *d = dir_in("run_out");
    char st[600], raw[600], sum[256];
    snprintf(st, sizeof st, "%s/new/folder/a.safetensors", d);
    snprintf(raw, sizeof raw, "%s/a.bin", d);
    int rc = cli("run " SHAPE " --tokens 5 --seed 2 --output %s", st);
    CHECK(rc == 0 && strstr(g_out, "output    wrote"), "rc %d: %s", rc, g_out);
    line_of("checksum", sum, sizeof sum);
    nvfp4moe_st_tensor t = {0};
    uint8_t *out = tensor_bytes(st, "output", &t);
    CHECK(out && t.dtype == NVFP4MOE_ST_BF16 && t.ndim == 2 && t.shape[0] == 5 && t.shape[1] == 64,
          "output tensor: %s %d dims", out ? nvfp4moe_st_dtype_name(t.dtype) : "missing", t.ndim);
    char want[64];
    snprintf(want, sizeof want, "fnv1a=%016llx", out ? (unsigned long long)t_fnv1a(out, (size_t)t.nbytes) : 0ull);
    CHECK(strstr(sum, want) != NULL, "'%s' does not hold the file's %s", sum, want);
    uint8_t *hid = tensor_bytes(st, "hidden_states", &t);
    CHECK(hid && t.dtype == NVFP4MOE_ST_BF16 && t.shape[0] == 5 && t.shape[1] == 64, "hidden_states");
    uint8_t *lg = tensor_bytes(st, "router_logits", &t);
    CHECK(lg && t.dtype == NVFP4MOE_ST_F32 && t.shape[0] == 5 && t.shape[1] == 8, "router_logits");
    CHECK(!tensor_bytes(st, "topk_ids", NULL), "topk_ids written without --topk-ids");
    /* the hidden states are the run's own: the seeded random ones */
    uint16_t *x = malloc(5 * 64 * 2);
    nvfp4moe_fill_normal(x, NVFP4MOE_DTYPE_BF16, 5 * 64, 2 * 31 + 7);
    CHECK(hid && !memcmp(hid, x, 5 * 64 * 2), "hidden_states are not the run's");
    char m[128];
    CHECK(!strcmp(meta_of(st, "backend", m, sizeof m), "CPU_FAST") && meta_of(st, "config", m, sizeof m)[0],
          "metadata backend '%s'", m);

    rc = cli("run " SHAPE " --tokens 5 --seed 2 --output %s", raw);
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    size_t n = 0;
    FILE *f = fopen(raw, "rb");
    uint8_t *rb = malloc(5 * 64 * 2 + 16);
    if (f) n = fread(rb, 1, 5 * 64 * 2 + 16, f), fclose(f);
    CHECK(n == 5 * 64 * 2 && out && !memcmp(rb, out, n), "raw output: %zu bytes", n);
    rc = cli("run " SHAPE " --tokens 2 --output %s/a.bin/x.safetensors", d);
    CHECK(rc == 1 && strstr(g_out, "--output") && strstr(g_out, "is not a folder"), "rc %d: %s", rc, g_out);

    T_CASE("run --input and --router-logits from an --output file reproduce it");
    char b[600], c[600], sum2[256];
    snprintf(b, sizeof b, "%s/b.safetensors", d);
    snprintf(c, sizeof c, "%s/c.safetensors", d);
    rc = cli("run " SHAPE " --seed 2 --input %s --router-logits %s --output %s", st, st, b);
    CHECK(rc == 0 && strstr(g_out, "input     hidden states from") && strstr(g_out, "routing   router logits from"),
          "rc %d: %s", rc, g_out);
    line_of("checksum", sum2, sizeof sum2);
    CHECK(!strcmp(sum, sum2), "'%s' vs '%s'", sum, sum2);
    rc = cli("run " SHAPE " --tokens 5 --seed 2 --input %s:hidden_states --router-logits %s:router_logits", st, st);
    line_of("checksum", sum2, sizeof sum2);
    CHECK(rc == 0 && !strcmp(sum, sum2), "FILE:NAME: rc %d '%s'", rc, sum2);
    rc = cli("run " SHAPE " --seed 2 --input %s --router-logits %s --moe-backend cpu_reference --output %s", st, st, c);
    CHECK(rc == 0 && strstr(g_out, "CPU_REFERENCE"), "rc %d: %s", rc, g_out);
    rc = cli("compare %s %s", b, c);
    CHECK(rc == 0 && (strstr(g_out, "verdict   close") || strstr(g_out, "verdict   identical")) &&
              strstr(g_out, "inputs    the same: hidden_states, router_logits") &&
              strstr(g_out, "from CPU_FAST on cpu") && strstr(g_out, "from CPU_REFERENCE on cpu"),
          "rc %d: %s", rc, g_out);
    CHECK(!strstr(g_out, "config    "), "the same config reported as different: %s", g_out);
    char w16[600];
    snprintf(w16, sizeof w16, "%s/w4a16.safetensors", d);
    rc = cli("run " SHAPE " --seed 2 --input %s --router-logits %s --scheme w4a16 --output %s", st, st, w16);
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    rc = cli("compare %s %s", w16, c);
    CHECK(rc == 2 && strstr(g_out, "config    A E=8 top_k=2 H=64 I=32 bf16 silu routing=renormalize w4a16, B ") &&
              strstr(g_out, "verdict   different"),
          "W4A16 against W4A4: rc %d: %s", rc, g_out);
    free(out), free(hid), free(lg), free(x), free(rb);
}

static void test_run_topk(void) {
    T_CASE("run --topk-ids / --topk-weights: the routing itself");
    const char *d = dir_in("topk");
    const int64_t M = 3, K = 2, H = 64;
    /* torch's topk gives int64 ids; weights float32 */
    const int64_t ids[] = {0, 7, 3, 3, 5, 1};   /* one token sends two slots to one expert */
    const float wts[] = {0.75f, 0.25f, 0.5f, 0.5f, 1.0f, -0.5f};
    float x[3 * 64];
    for (int i = 0; i < M * H; i++) x[i] = (float)((i * 37) % 23 - 11) / 8.0f;
    char f_ids[600], f_w[600], f_x[600], f_out[600];
    snprintf(f_ids, sizeof f_ids, "%s/ids.safetensors", d);
    snprintf(f_w, sizeof f_w, "%s/w.bin", d);
    snprintf(f_x, sizeof f_x, "%s/x.bin", d);
    snprintf(f_out, sizeof f_out, "%s/out.safetensors", d);
    const char *names[] = {"topk_ids"};
    const nvfp4moe_st_dtype dts[] = {NVFP4MOE_ST_I64};
    const int64_t shapes[][2] = {{M, K}};
    const void *data[] = {ids};
    write_st(f_ids, 1, names, dts, shapes, data);
    write_bytes(f_w, wts, sizeof wts);
    write_bytes(f_x, x, sizeof x);
    int rc = cli("run " SHAPE " --seed 6 --moe-backend cpu_reference --input %s --topk-ids %s --topk-weights %s "
                 "--output %s", f_x, f_ids, f_w, f_out);
    CHECK(rc == 0 && strstr(g_out, "routing   top-k ids and weights"), "rc %d: %s", rc, g_out);
    /* the same layer (seed 6), hidden states and routing through the reference here */
    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    cfg.num_experts = 8, cfg.top_k = 2, cfg.hidden_size = 64, cfg.intermediate_size = 32, cfg.seed = 6;
    nvfp4moe_layer *l = NULL;
    CHECK_OK(nvfp4moe_layer_random(&cfg, 6, &l));
    uint16_t xb[3 * 64], want[3 * 64];
    nvfp4moe_from_float(NVFP4MOE_DTYPE_BF16, x, M * H, xb);
    int32_t ids32[6];
    for (int i = 0; i < 6; i++) ids32[i] = (int32_t)ids[i];
    nvfp4moe_io io = {.num_tokens = M, .hidden = xb, .topk_ids = ids32, .topk_weights = wts, .output = want};
    if (l) CHECK_OK(nvfp4moe_reference_forward(&cfg, &l->w, &io));
    nvfp4moe_layer_free(l);
    nvfp4moe_st_tensor t = {0};
    uint8_t *got = tensor_bytes(f_out, "output", &t);
    CHECK(got && t.nbytes == sizeof want && !memcmp(got, want, sizeof want), "the output is not the reference's");
    free(got);
    uint8_t *gi = tensor_bytes(f_out, "topk_ids", &t);
    CHECK(gi && t.dtype == NVFP4MOE_ST_I32 && t.shape[0] == 3 && t.shape[1] == 2 && ((int32_t *)gi)[1] == 7,
          "topk_ids in the output file");
    free(gi);
    CHECK(!tensor_bytes(f_out, "router_logits", NULL), "router_logits written although not used");
    /* the output file feeds the next run: same routing, same output */
    char sum[256], sum2[256];
    line_of("checksum", sum, sizeof sum);
    rc = cli("run " SHAPE " --seed 6 --moe-backend cpu_reference --input %s --topk-ids %s --topk-weights %s", f_out,
             f_out, f_out);
    line_of("checksum", sum2, sizeof sum2);
    CHECK(rc == 0 && !strcmp(sum, sum2), "rc %d: '%s' vs '%s'", rc, sum, sum2);

    T_CASE("run's input files: each problem names the file and the field");
    char bad[600], f_f32ids[600];
    snprintf(bad, sizeof bad, "%s/bad.bin", d);
    snprintf(f_f32ids, sizeof f_f32ids, "%s/f32ids.safetensors", d);
    const int32_t out_of_range[] = {0, 1, 2, 8, 4, 5};
    write_bytes(bad, out_of_range, sizeof out_of_range);
    rc = cli("run " SHAPE " --topk-ids %s --topk-weights %s", bad, f_w);
    CHECK(rc == 1 && strstr(g_out, "--topk-ids") && strstr(g_out, "bad.bin") && strstr(g_out, "[1][1] = 8") &&
              strstr(g_out, "is not an expert in [0, 8)") && !strstr(g_out, "layer "),
          "rc %d: %s", rc, g_out);
    const float nan_w[] = {0.5f, 0.5f, NAN, 0.5f, 1.0f, 0.0f};
    write_bytes(bad, nan_w, sizeof nan_w);
    rc = cli("run " SHAPE " --topk-ids %s --topk-weights %s", f_ids, bad);
    CHECK(rc == 1 && strstr(g_out, "--topk-weights") && strstr(g_out, "[1][0] = nan is not finite"), "rc %d: %s",
          rc, g_out);
    const void *fdata[] = {wts};
    const nvfp4moe_st_dtype fdt[] = {NVFP4MOE_ST_F32};
    write_st(f_f32ids, 1, names, fdt, shapes, fdata);
    rc = cli("run " SHAPE " --topk-ids %s --topk-weights %s", f_f32ids, f_w);
    CHECK(rc == 1 && strstr(g_out, "tensor \"topk_ids\" is F32; expected I32"), "rc %d: %s", rc, g_out);
    rc = cli("run " SHAPE " --top-k 3 --topk-ids %s --topk-weights %s", f_ids, f_w);
    CHECK(rc == 1 && strstr(g_out, "tensor \"topk_ids\" of") && strstr(g_out, "has shape [3, 2], expected [M, top_k]"),
          "rc %d: %s", rc, g_out);
    rc = cli("run " SHAPE " --topk-ids %s", f_ids);
    CHECK(rc == 1 && strstr(g_out, "--topk-ids needs --topk-weights too"), "rc %d: %s", rc, g_out);
    rc = cli("run " SHAPE " --topk-ids %s --topk-weights %s --router-logits %s", f_ids, f_w, f_x);
    CHECK(rc == 1 && strstr(g_out, "pass one of them"), "rc %d: %s", rc, g_out);
    rc = cli("run " SHAPE " --tokens 4 --topk-ids %s --topk-weights %s", f_ids, f_w);
    CHECK(rc == 1 && strstr(g_out, "--tokens 4 disagrees with --topk-ids"), "rc %d: %s", rc, g_out);
    write_bytes(bad, x, 2 * 64 * 4);
    rc = cli("run " SHAPE " --input %s --topk-ids %s --topk-weights %s", bad, f_ids, f_w);
    CHECK(rc == 1 && strstr(g_out, "holds 3 tokens but --input") && strstr(g_out, "holds 2"), "rc %d: %s", rc, g_out);
    write_bytes(bad, x, 100);
    rc = cli("run " SHAPE " --router-logits %s", bad);
    CHECK(rc == 1 && strstr(g_out, "100 bytes is not a whole number of rows of 8 F32 values"), "rc %d: %s", rc,
          g_out);
    rc = cli("run " SHAPE " --router-logits %s:router_logits", f_ids);
    CHECK(rc == 1 && strstr(g_out, "no tensor \"router_logits\" in the file"), "rc %d: %s", rc, g_out);
    rc = cli("run " SHAPE " --router-logits %s/none.bin", d);
    CHECK(rc == 1 && strstr(g_out, "--router-logits") && strstr(g_out, "none.bin"), "rc %d: %s", rc, g_out);
    rc = cli("run " SHAPE " --routing simulated --router-logits %s", f_x);
    CHECK(rc == 1 && strstr(g_out, "the simulated routing reads no router logits"), "rc %d: %s", rc, g_out);
    rc = cli("run " SHAPE " --ep 2 --output %s/ep.bin", d);
    CHECK(rc == 1 && strstr(g_out, "--output does not apply with --ep"), "rc %d: %s", rc, g_out);
}

// ---- --json ----

static void test_json(void) {
    T_CASE("run --json");
    int rc = cli("run " SHAPE " --tokens 2 --seed 8");
    char sum[256];
    line_of("checksum", sum, sizeof sum);
    rc = cli_stdout("run " SHAPE " --tokens 2 --seed 8 --json");
    json_t *j = parse_json(g_stdout);
    const char *fnv = json_string_value(json_object_get(json_object_get(j, "checksum"), "fnv1a"));
    char want[64];
    snprintf(want, sizeof want, "fnv1a=%s", fnv ? fnv : "?");
    CHECK(rc == 0 && fnv && strstr(sum, want) && json_integer_value(json_object_get(j, "tokens")) == 2 &&
              !strcmp(jstr(json_object_get(j, "backend")), "CPU_FAST") &&
              json_is_number(json_object_get(j, "forward_ms")),
          "rc %d: %.500s", rc, g_stdout);
    json_decref(j);
    rc = cli("run " SHAPE " --ep 2 --json");
    CHECK(rc == 1 && strstr(g_out, "--json does not apply with --ep"), "rc %d: %s", rc, g_out);

    T_CASE("inspect --json");
    const char *m = dir_in("json_model");
    rc = cli("quantize --random " SHAPE " --num-layers 2 --first-moe-layer 1 --out %s/src", m);
    rc |= cli("quantize --in %s/src --out %s/q", m, m);
    CHECK(rc == 0, "rc %d: %s", rc, g_out);
    rc = cli_stdout("inspect %s/q --json", m);
    j = parse_json(g_stdout);
    json_t *layers = json_object_get(j, "layers");
    CHECK(rc == 0 && json_is_true(json_object_get(j, "ok")) && json_array_size(layers) == 1 &&
              json_integer_value(json_object_get(json_array_get(layers, 0), "index")) == 1 &&
              !strcmp(jstr(json_object_get(json_array_get(layers, 0), "status")), "ok") &&
              json_integer_value(json_object_get(json_object_get(j, "moe"), "num_experts")) == 8 &&
              !strcmp(jstr(json_object_get(json_object_get(j, "quantization"), "scheme")), "w4a4"),
          "rc %d: %.600s", rc, g_stdout);
    json_decref(j);
    rc = cli_stdout("inspect %s/src --json", m);
    j = parse_json(g_stdout);
    CHECK(rc == 0 && json_is_null(json_object_get(j, "quantization")) &&
              !strcmp(jstr(json_object_get(json_array_get(json_object_get(j, "layers"), 0), "status")),
                      "unquantized"),
          "rc %d: %.600s", rc, g_stdout);
    json_decref(j);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/broken && cp %s/q/*.json %s/broken/ && head -c 3000 %s/q/model.safetensors "
             "> %s/broken/model.safetensors", m, m, m, m, m);
    CHECK(system(cmd) == 0, "copy");
    rc = cli_stdout("inspect %s/broken --json", m);
    j = parse_json(g_stdout);
    CHECK(rc == 1 && json_is_false(json_object_get(j, "ok")) && json_array_size(json_object_get(j, "problems")) >= 1,
          "rc %d: %.600s", rc, g_stdout);
    json_decref(j);
    rc = cli_stdout("inspect %s/none --json", m);
    j = parse_json(g_stdout);
    CHECK(rc == 1 && json_is_false(json_object_get(j, "ok")), "a missing model: rc %d: %.300s", rc, g_stdout);
    json_decref(j);
}

/* bench --cpu on the smallest preset: its default output folder is made, and it writes JSON lines
 * beside the CSV; with --json its stdout is those lines alone. */
static void test_bench_files(void) {
    T_CASE("bench --cpu: default folder, JSON lines");
    const char *d = dir_in("bench_cwd");
    int rc = cli_stdout("bench --cpu --preset qwen3-30b-a3b --m 1,2 --iters 1 --threads 1 --commit test --json "
                        "--help");
    CHECK(rc == 0 && strstr(g_stdout, "nvfp4moe-bench/<date>-cpu-<threads>t"), "bench --cpu --help names the default: %.300s", g_stdout);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' bench --cpu --preset qwen3-30b-a3b --m 1,2 --iters 1 --threads 1 "
             "--commit test --json 2>/dev/null", d, getenv("NVFP4MOE_CLI"));
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(g_stdout, 1, sizeof g_stdout - 1, p) : 0;
    g_stdout[n] = '\0';
    rc = p ? pclose(p) : -1;
    CHECK(rc == 0, "bench --cpu failed (%d): %s", rc, g_stdout);
    int lines = 0;
    for (char *s = g_stdout, *e; *s; s = e + 1) {
        if (!(e = strchr(s, '\n'))) break;
        *e = '\0';
        json_t *j = parse_json(s);
        CHECK(j && !strcmp(jstr(json_object_get(j, "preset")), "qwen3-30b-a3b") &&
                  json_integer_value(json_object_get(j, "M")) == lines + 1 &&
                  json_is_number(json_object_get(j, "ms_median")) &&
                  json_is_integer(json_object_get(j, "hot_tokens")) &&
                  json_integer_value(json_object_get(j, "hot_tokens")) == 0,
              "line %d: %s", lines, s);
        json_decref(j);
        lines++;
    }
    CHECK(lines == 2, "%d JSON lines on stdout", lines);
    char folder[700];
    snprintf(folder, sizeof folder, "%s/nvfp4moe-bench", d);
    CHECK(entries_of(folder, ".csv") == 1 && entries_of(folder, ".md") == 1 && entries_of(folder, ".jsonl") == 1,
          "%s holds %d csv, %d md, %d jsonl", folder, entries_of(folder, ".csv"), entries_of(folder, ".md"),
          entries_of(folder, ".jsonl"));
}

/* The experts the CPU bench's routing of M tokens touches on Qwen3-30B-A3B (E=128, top-8,
 * renormalize), recomputed from its recipe (tools/cmd_bench_cpu.c): random normal logits from seed
 * 8, with hot > 0 that many made hot by nvfp4moe_hot_expert_logits from the same seed. */
static int touched_experts(int64_t M, int64_t hot) {
    enum { E = 128, K = 8 };
    nvfp4moe_config c;
    nvfp4moe_config_init(&c);
    c.num_experts = E;
    c.top_k = K;
    c.hidden_size = 2048;
    c.intermediate_size = 768;
    float *logits = malloc(sizeof(float) * (size_t)(M * E)), *w = malloc(sizeof(float) * (size_t)(M * K));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(M * K));
    bool seen[E] = {false};
    int n = -1;
    if (logits && w && ids) {
        nvfp4moe_fill_normal(logits, NVFP4MOE_DTYPE_F32, M * E, 8);
        nvfp4moe_hot_expert_logits(logits, M, E, hot, 8, NULL);
        if (nvfp4moe_route(&c, logits, M, NULL, ids, w) == NVFP4MOE_OK) {
            n = 0;
            for (int64_t i = 0; i < M * K; i++) {
                n += !seen[ids[i]];
                seen[ids[i]] = true;
            }
        }
    }
    free(logits); free(w); free(ids);
    return n;
}

/* bench --cpu --hot-tokens: the markdown states the routing and N, every row carries its hot
 * tokens, the experts column counts what the skewed routing touched; bad values are refused. */
static void test_bench_hot(void) {
    T_CASE("bench --cpu --hot-tokens: the routing stated, the experts it touched");
    const char *d = dir_in("bench_hot");
    /* M=16 with 12 hot tokens touches fewer experts than uniform routing: the count tells them apart */
    const int want[2] = {touched_experts(1, 12), touched_experts(16, 12)};
    CHECK(want[0] == 8 && want[1] > 0 && want[1] != touched_experts(16, 0), "the case: %d / %d experts, uniform %d",
          want[0], want[1], touched_experts(16, 0));
    int rc = cli_stdout("bench --cpu --preset qwen3-30b-a3b --m 1,16 --hot-tokens 12 --iters 1 --threads 1 "
                        "--commit test --json --out %s/hot", d);
    CHECK(rc == 0, "bench --cpu --hot-tokens failed (%d): %s", rc, g_stdout);
    int lines = 0;
    for (char *s = g_stdout, *e; *s; s = e + 1) {
        if (!(e = strchr(s, '\n'))) break;
        *e = '\0';
        json_t *j = parse_json(s);
        const json_int_t M = json_integer_value(json_object_get(j, "M"));
        const int i = M == 1 ? 0 : 1;
        CHECK(json_integer_value(json_object_get(j, "hot_tokens")) == (M < 12 ? M : 12) &&
                  json_integer_value(json_object_get(j, "experts")) == want[i] &&
                  json_is_null(json_object_get(j, "ggml_16c_ms")),
              "M=%lld: hot_tokens %lld, experts %lld (want %d), ggml %s", (long long)M,
              (long long)json_integer_value(json_object_get(j, "hot_tokens")),
              (long long)json_integer_value(json_object_get(j, "experts")), want[i],
              json_is_null(json_object_get(j, "ggml_16c_ms")) ? "not quoted" : "quoted (uniform routing's)");
        json_decref(j);
        lines++;
    }
    CHECK(lines == 2, "%d JSON lines", lines);
    char path[700];
    snprintf(path, sizeof path, "%s/hot.md", d);
    static char md[16384];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(md, 1, sizeof md - 1, f) : 0;
    md[n] = '\0';
    if (f) fclose(f);
    CHECK(strstr(md, "- routing: hot-expert routing (--hot-tokens 12): in each point 12 of the M tokens") &&
              !strstr(md, "uniform random routing ("),
          "the markdown states the routing: %.1500s", md);
    snprintf(path, sizeof path, "%s/hot.csv", d);
    f = fopen(path, "r");
    n = f ? fread(md, 1, sizeof md - 1, f) : 0;
    md[n] = '\0';
    if (f) fclose(f);
    CHECK(!strncmp(md, "preset,scheme,M,hot_tokens,", 27) && strstr(md, "\nqwen3-30b-a3b,w4a4,16,12,"),
          "the CSV's hot_tokens column: %.300s", md);

    T_CASE("bench --hot-tokens: bad values refused, naming the flag");
    static const char *const bad[] = {"-1", "abc", "3x", "1.5", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = cli("bench --cpu --preset qwen3-30b-a3b --m 1 --iters 1 --threads 1 --out %s/bad --hot-tokens='%s'", d,
                 bad[i]);
        CHECK(rc == 1 && strstr(g_out, "--hot-tokens") && !strstr(g_out, "wrote"), "--cpu '%s': rc %d: %s", bad[i], rc,
              g_out);
        rc = cli("bench --preset qwen3-30b-a3b --out %s/bad --hot-tokens='%s'", d, bad[i]);
        CHECK(rc == 1 && strstr(g_out, "--hot-tokens") && !strstr(g_out, "wrote"), "GPU bench '%s': rc %d: %s", bad[i],
              rc, g_out);
    }
    rc = cli("bench --cpu --hot-tokens -1");
    CHECK(rc == 1 && strstr(g_out, "nvfp4moe bench --cpu: --hot-tokens expects a whole number >= 0, got '-1'"),
          "the message: %s", g_out);
    rc = cli("bench --cpu --stream --hot-tokens 4 --out %s/stream", d);
    CHECK(rc == 1 && strstr(g_out, "--hot-tokens: --stream times the kernel alone"), "with --stream: rc %d: %s", rc,
          g_out);
    rc = cli("bench --ep 2 --hot-tokens 4 --out %s/ep", d);
    CHECK(rc == 1 && strstr(g_out, "unknown flag '--hot-tokens'"), "bench --ep has no hot routing: rc %d: %s", rc,
          g_out);
}

// ---- compare ----

static void test_compare(void) {
    T_CASE("compare: figures, verdicts, exit status");
    const char *d = dir_in("compare");
    enum { N = 4 * 16 };
    float ref[N], near[N], far[N], nan_a[N];
    for (int i = 0; i < N; i++) {
        ref[i] = (float)((i * 7) % 13 - 6) / 4.0f;
        near[i] = ref[i] * (1.0f + 1e-3f);
        far[i] = ref[i] + 0.5f;
        nan_a[i] = ref[i];
    }
    near[0] = ref[0] + 0.01f;   /* the largest difference, at [0, 0] */
    nan_a[17] = NAN;
    char f_ref[600], f_near[600], f_far[600], f_nan[600], f_raw[600], f_other[600];
    snprintf(f_ref, sizeof f_ref, "%s/ref.safetensors", d);
    snprintf(f_near, sizeof f_near, "%s/near.safetensors", d);
    snprintf(f_far, sizeof f_far, "%s/far.safetensors", d);
    snprintf(f_nan, sizeof f_nan, "%s/nan.safetensors", d);
    snprintf(f_raw, sizeof f_raw, "%s/near.bin", d);
    snprintf(f_other, sizeof f_other, "%s/other.safetensors", d);
    const char *names[] = {"output"};
    const nvfp4moe_st_dtype dt[] = {NVFP4MOE_ST_F32};
    const int64_t shapes[][2] = {{4, 16}}, other_shape[][2] = {{8, 8}};
    write_st(f_ref, 1, names, dt, shapes, (const void *const[]){ref});
    write_st(f_near, 1, names, dt, shapes, (const void *const[]){near});
    write_st(f_far, 1, names, dt, shapes, (const void *const[]){far});
    write_st(f_nan, 1, names, dt, shapes, (const void *const[]){nan_a});
    write_st(f_other, 1, names, dt, other_shape, (const void *const[]){ref});
    write_bytes(f_raw, near, sizeof near);

    int rc = cli("compare %s %s", f_ref, f_ref);
    CHECK(rc == 0 && strstr(g_out, "verdict   identical") && strstr(g_out, "differ    0 of 64"), "rc %d: %s", rc,
          g_out);
    rc = cli("compare %s %s", f_near, f_ref);
    CHECK(rc == 0 && strstr(g_out, "verdict   close") && strstr(g_out, "max abs   1.000e-02 at [0, 0]"), "rc %d: %s",
          rc, g_out);
    rc = cli("compare %s %s --tolerance 1e-4", f_near, f_ref);
    CHECK(rc == 2 && strstr(g_out, "verdict   different: relative error"), "rc %d: %s", rc, g_out);
    rc = cli("compare %s %s", f_far, f_ref);
    CHECK(rc == 2 && strstr(g_out, "verdict   different"), "rc %d: %s", rc, g_out);
    rc = cli("compare %s %s", f_nan, f_ref);
    CHECK(rc == 2 && strstr(g_out, "NOT in the same places") && strstr(g_out, "1 non-finite values in one file only"),
          "rc %d: %s", rc, g_out);
    rc = cli("compare %s %s --dtype f32", f_raw, f_ref);
    CHECK(rc == 0 && strstr(g_out, "verdict   close") && strstr(g_out, "at [0, 0]"), "raw: rc %d: %s", rc, g_out);
    rc = cli("compare %s %s", f_raw, f_ref);
    CHECK(rc == 1 && strstr(g_out, "A (") && strstr(g_out, "has shape [128]"), "raw read as bf16: rc %d: %s", rc,
          g_out);
    rc = cli("compare %s %s", f_other, f_ref);
    CHECK(rc == 1 && strstr(g_out, "[8, 8]") && strstr(g_out, "[4, 16]"), "shapes: rc %d: %s", rc, g_out);
    rc = cli("compare %s", f_ref);
    CHECK(rc == 1 && strstr(g_out, "needs two files"), "rc %d: %s", rc, g_out);
    rc = cli("compare %s %s/none.safetensors", f_ref, d);
    CHECK(rc == 1 && strstr(g_out, "none.safetensors"), "rc %d: %s", rc, g_out);
    rc = cli("compare %s %s --tensor logits", f_ref, f_ref);
    CHECK(rc == 1 && strstr(g_out, "no tensor \"logits\""), "rc %d: %s", rc, g_out);
    rc = cli_stdout("compare %s %s --json", f_near, f_ref);
    json_t *j = parse_json(g_stdout);
    CHECK(rc == 0 && !strcmp(jstr(json_object_get(j, "verdict")), "close") &&
              json_real_value(json_object_get(j, "max_abs")) > 0.0099 &&
              json_real_value(json_object_get(j, "max_abs")) < 0.0101 &&
              json_integer_value(json_object_get(j, "values")) == 64 && json_is_null(json_object_get(j, "same_inputs")),
          "rc %d: %.500s", rc, g_stdout);
    json_decref(j);
}

int main(void) {
    char cli_path[4096];
    if (!getenv("NVFP4MOE_CLI") || !realpath(getenv("NVFP4MOE_CLI"), cli_path)) {
        printf("NVFP4MOE_CLI is not set (or not a file): the command-line tests need it (make test sets it)\n");
        return t_finish("test_cli");
    }
    setenv("NVFP4MOE_CLI", cli_path, 1);   /* absolute: some tests run it in another directory */
    fixtures_begin("nvfp4moe-cli");
    test_help();
    test_flag_forms();
    test_did_you_mean();
    test_no_gpu();
    test_select_unquantized();
    test_run_output();
    test_run_topk();
    test_json();
    test_bench_files();
    test_bench_hot();
    test_compare();
    fixtures_end();
    return t_finish("test_cli");
}
