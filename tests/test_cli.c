/*
 * test_cli.c - the command line as a user meets it, through the built binary ($NVFP4MOE_CLI):
 * getopt_long's conventions in every subcommand (--flag=value, --flag value, -h, "--", flags and
 * operands in any order, no abbreviations), --help laid out in columns, "did you mean" for flags,
 * subcommands, backends, devices and presets, `run --device` refusing a GPU that is not here,
 * `select --model` warning about an unquantized model, and bench creating its output folder.
 */
#include "ckpt_fixtures.h"

#include <dirent.h>

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

/* How many entries of dir hold `part` in their name. */
static int entries_of(const char *dir, const char *part) {
    DIR *dd = opendir(dir);
    int n = 0;
    for (struct dirent *e; dd && (e = readdir(dd));) n += strstr(e->d_name, part) != NULL;
    if (dd) closedir(dd);
    return n;
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
    static const char *const cmds[] = {"run", "select", "inspect", "quantize", "bench", "bench --cpu", "bench --ep 2"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        int rc = cli_stdout("%s --help", cmds[i]);
        CHECK(rc == 0 && strstr(g_stdout, "usage: nvfp4moe"), "%s --help: rc %d: %.200s", cmds[i], rc, g_stdout);
        const int n = check_help_columns(cmds[i], g_stdout);
        CHECK(n >= 2, "%s --help: %d flag lines", cmds[i], n);
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
    rc = cli_stdout("help inspect");
    CHECK(rc == 0 && strstr(g_stdout, "usage: nvfp4moe inspect"), "help inspect: rc %d", rc);
    rc = cli_stdout("--help");
    CHECK(rc == 0 && strstr(g_stdout, "  inspect ") && strstr(g_stdout, "--flag=value"), "nvfp4moe --help");
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
    rc = cli("inpsect x");
    CHECK(rc == 1 && strstr(g_out, "did you mean 'inspect'?"), "rc %d: %s", rc, g_out);
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

/* bench --cpu on the smallest preset, from a fresh directory: its default output folder is made. */
static void test_bench_files(void) {
    T_CASE("bench --cpu: the default folder");
    const char *d = dir_in("bench_cwd");
    int rc = cli_stdout("bench --cpu --help");
    CHECK(rc == 0 && strstr(g_stdout, "nvfp4moe-bench/<date>-cpu-<threads>t"), "bench --cpu --help names the default: "
          "%.300s", g_stdout);
    rc = cli("bench --cpu --preset qwen3-30b-a3b --m 1 --iters 1 --threads 1 --commit test --out %s/a/b/c", d);
    char p[700];
    snprintf(p, sizeof p, "%s/a/b", d);
    CHECK(rc == 0 && entries_of(p, "c.csv") == 1 && entries_of(p, "c.md") == 1, "--out's folders: rc %d: %s", rc,
          g_out);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' bench --cpu --preset qwen3-30b-a3b --m 1 --iters 1 --threads 1 "
             "--commit test >/dev/null 2>&1", d, getenv("NVFP4MOE_CLI"));
    CHECK(system(cmd) == 0, "bench --cpu failed");
    char folder[700];
    snprintf(folder, sizeof folder, "%s/nvfp4moe-bench", d);
    CHECK(entries_of(folder, ".csv") == 1 && entries_of(folder, ".md") == 1, "%s holds %d csv, %d md", folder,
          entries_of(folder, ".csv"), entries_of(folder, ".md"));
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
    test_bench_files();
    fixtures_end();
    return t_finish("test_cli");
}
