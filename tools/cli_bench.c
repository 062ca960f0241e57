/*
 * cli_bench.c - what the benchmarks (tools/cmd_bench*.c) share: a preset's layer config, random
 * NVFP4 bytes, the commit and date their results are stamped with, where their files go, and the
 * JSON lines beside their CSV.
 */
#include "cli_ep.h"
#include "core/internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

FILE *cli_bench_text;

void cli_preset_config(const cli_layer_preset *p, nvfp4moe_config *cfg) {
    nvfp4moe_config_init(cfg);
    cfg->num_experts = p->E;
    cfg->top_k = p->k;
    cfg->hidden_size = p->H;
    cfg->intermediate_size = p->I;
    cfg->activation = p->act;
    cfg->has_swiglu_limit = p->limit;
    cfg->swiglu_limit = p->limit_value;
}

void cli_fill_nvfp4(uint8_t *d, size_t n, uint64_t seed, bool e4m3) {
    uint64_t s = seed;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = nvfp4moe_rand_u64(&s);
        if (!e4m3) {
            memcpy(d + i, &v, 8);
        } else {
            /* E4M3 in [2^-3, 448]: codes 0x20..0x7E (positive, never zero, never NaN). */
            for (int b = 0; b < 8; b++) d[i + b] = (uint8_t)(0x20 + ((v >> (8 * b)) & 0xFF) % 95);
        }
    }
    for (uint64_t v = nvfp4moe_rand_u64(&s); i < n; i++, v >>= 8) d[i] = e4m3 ? (uint8_t)(0x20 + (v & 0xFF) % 95) : (uint8_t)v;
}

void cli_bench_stamp(const char *commit, char *commit_out, size_t commit_len, char *date, size_t date_len, char *day,
                     size_t day_len) {
    char c[64] = "unknown";
    if (!commit) {
        FILE *g = popen("git rev-parse --short HEAD 2>/dev/null", "r");
        if (g) {
            if (fgets(c, sizeof c, g)) c[strcspn(c, "\n")] = 0;
            pclose(g);
        }
        commit = c;
    }
    snprintf(commit_out, commit_len, "%s", commit);
    time_t now = time(NULL);
    strftime(date, date_len, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    strftime(day, day_len, "%Y-%m-%d", gmtime(&now));
}

void cli_bench_command(int argc, char **argv, char *buf, size_t len) {
    snprintf(buf, len, "nvfp4moe");
    for (int i = 0; i < argc; i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, len - l, " %s", argv[i]);
    }
}

void cli_bench_default_prefix(const char *day, const char *what, char *buf, size_t len) {
    snprintf(buf, len, "%s/%s-%s", CLI_BENCH_DEFAULT_DIR, day, what);
}

int cli_bench_write_jsonl(const char *prefix, json_t **rows, int n, bool to_stdout) {
    char path[1100];
    snprintf(path, sizeof path, "%s.jsonl", prefix);
    FILE *f = fopen(path, "w");
    int rc = f ? 0 : -1;
    if (!f) fprintf(stderr, "%s: cannot write %s: %s\n", cli_cmd_name(), path, strerror(errno));
    for (int i = 0; i < n; i++) {
        char *line = rows[i] ? json_dumps(rows[i], JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
        if (line) {
            if (f && fprintf(f, "%s\n", line) < 0) rc = -1;
            if (to_stdout) printf("%s\n", line);
            free(line);
        }
        json_decref(rows[i]);
        rows[i] = NULL;
    }
    if (f && fclose(f) != 0) rc = -1;
    if (f && rc) fprintf(stderr, "%s: cannot write %s\n", cli_cmd_name(), path);
    if (to_stdout) fflush(stdout);
    return rc;
}

void cli_bench_routing_words(long long hot, char *buf, size_t len) {
    if (hot <= 0)
        snprintf(buf, len, "uniform random routing (random logits, renormalize)");
    else
        snprintf(buf, len, "hot-expert routing (--hot-tokens %lld): in each point %lld of the M tokens (all of them "
                           "when M <= %lld), a random subset drawn from the logits' seed, have expert 0's logit set 1 "
                           "above their largest other, so that expert 0 is their first choice; the other logits, and "
                           "the other tokens' routing, uniform random; renormalize", hot, hot, hot);
}

int cli_parse_presets(const char *flag, const char *list, const cli_layer_preset *presets, int n,
                      const cli_layer_preset **out, int cap) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    int count = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const cli_layer_preset *found = NULL;
        nvfp4moe_suggest sg;
        nvfp4moe_suggest_init(&sg, tok);
        for (int p = 0; p < n; p++) {
            if (!strcmp(tok, presets[p].name)) found = &presets[p];
            nvfp4moe_suggest_add(&sg, presets[p].name);
        }
        if (!found) {
            const char *best = nvfp4moe_suggest_best(&sg);
            fprintf(stderr, "%s: %s: unknown preset '%s'%s%s%s (the presets:", cli_cmd_name(), flag, tok,
                    best ? "; did you mean '" : "", best ? best : "", best ? "'?" : "");
            for (int p = 0; p < n; p++) fprintf(stderr, " %s", presets[p].name);
            fprintf(stderr, ")\n");
            return -1;
        }
        if (count == cap) {
            fprintf(stderr, "%s: %s: at most %d presets\n", cli_cmd_name(), flag, cap);
            return -1;
        }
        out[count++] = found;
    }
    if (!count) fprintf(stderr, "%s: %s: no preset in '%s'\n", cli_cmd_name(), flag, list);
    return count ? count : -1;
}
