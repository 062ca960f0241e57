/*
 * words.c - how vLLM words its reasons and messages: the names it prints for routing methods,
 * dtypes, quant schemes and parallel configs, and Python's repr() of the values its f-strings
 * format; and the bounded string builder the oracle writes with.
 */
#include "oracle/table.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- the words of vLLM's reasons ----

const char *nvfp4moe_routing_type_name(nvfp4moe_routing r) {
    switch (r) {
    case NVFP4MOE_ROUTING_SOFTMAX_TOPK:      return "RoutingMethodType.Default";
    case NVFP4MOE_ROUTING_RENORMALIZE:       return "RoutingMethodType.Renormalize";
    case NVFP4MOE_ROUTING_DEEPSEEK_V3:       return "RoutingMethodType.DeepSeekV3";
    case NVFP4MOE_ROUTING_LLAMA4:            return "RoutingMethodType.Llama4";
    case NVFP4MOE_ROUTING_RENORMALIZE_NAIVE: return "RoutingMethodType.RenormalizeNaive";
    case NVFP4MOE_ROUTING_SIGMOID_RENORM:    return "RoutingMethodType.SigmoidRenorm";
    case NVFP4MOE_ROUTING_MINIMAX2:          return "RoutingMethodType.MiniMax2";
    case NVFP4MOE_ROUTING_SIGMOID:           return "RoutingMethodType.Sigmoid";
    case NVFP4MOE_ROUTING_SIMULATED:         return "RoutingMethodType.Simulated";
    case NVFP4MOE_ROUTING_COUNT:             break;
    }
    return "RoutingMethodType.Unspecified";
}

const char *nvfp4moe_torch_dtype_name(nvfp4moe_dtype d) {
    switch (d) {
    case NVFP4MOE_DTYPE_BF16: return "torch.bfloat16";
    case NVFP4MOE_DTYPE_FP16: return "torch.float16";
    case NVFP4MOE_DTYPE_F32:  return "torch.float32";
    }
    return "torch.?";
}

void nvfp4moe_quant_scheme_str(nvfp4moe_scheme s, char *buf, size_t len) {
    const char *a = "None";
    switch (s) {
    case NVFP4MOE_SCHEME_W4A4:           a = "kNvfp4Dynamic"; break;
    case NVFP4MOE_SCHEME_W4A4_PER_TOKEN: a = "kNvfp4DynamicToken"; break;
    case NVFP4MOE_SCHEME_W4A16:          a = "None"; break;
    case NVFP4MOE_SCHEME_W4A8_MXFP8:     a = "kMxfp8Dynamic"; break;
    case NVFP4MOE_SCHEME_COUNT:          break;
    }
    snprintf(buf, len, "kNvfp4Staticx%s (%s)", a, nvfp4moe_scheme_name(s));
}

void nvfp4moe_parallel_str(const oracle_ctx *c, char *buf, size_t len) {
    const nvfp4moe_parallel *p = &c->cfg->parallel;
    char a2a[40];
    if (p->all2all[0])
        snprintf(a2a, sizeof a2a, "'%s'", p->all2all);
    else
        nvfp4moe_strlcpy(a2a, "None", sizeof a2a);
    snprintf(buf, len,
             "FusedMoEParallelConfig(tp_size=%d, dp_size=%d, ep_size=%d, use_ep=%s, "
             "all2all_backend=%s, enable_eplb=%s)",
             (int)p->tp_size, (int)p->dp_size, (int)p->ep_size, c->use_ep ? "True" : "False", a2a,
             p->eplb ? "True" : "False");
}

// ---- Python's repr, for the messages vLLM formats with f-strings ----

/* repr(float): the shortest digits that read back as the same float32 (the value came from a
 * config file as a decimal), fixed notation for 1e-4 <= |x| < 1e16 with at least ".0", else
 * "1e-05" / "1.5e+16". */
void nvfp4moe_py_float_repr(float x, char *out, size_t len) {
    if (isnan(x)) { nvfp4moe_strlcpy(out, "nan", len); return; }
    if (isinf(x)) { nvfp4moe_strlcpy(out, x < 0 ? "-inf" : "inf", len); return; }
    if (x == 0) { nvfp4moe_strlcpy(out, signbit(x) ? "-0.0" : "0.0", len); return; }
    char e[48];
    for (int p = 1; p <= 9; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, (double)x);
        if (strtof(e, NULL) == x) break;
    }
    /* e = "[-]d.ddde[+-]XX": split into sign, digits, exponent. */
    bool neg = e[0] == '-';
    const char *m = e + neg;
    char digits[16];
    int nd = 0;
    for (const char *q = m; *q && *q != 'e' && nd < 15; q++)
        if (isdigit((unsigned char)*q)) digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int exp10 = atoi(strchr(e, 'e') + 1);
    char body[64];
    if (exp10 >= -4 && exp10 < 16) {
        size_t u = 0;
        if (exp10 < 0) {
            u += (size_t)snprintf(body + u, sizeof body - u, "0.");
            for (int i = 0; i < -exp10 - 1; i++) body[u++] = '0';
            u += (size_t)snprintf(body + u, sizeof body - u, "%s", digits);
        } else {
            for (int i = 0; i <= exp10; i++) body[u++] = i < nd ? digits[i] : '0';
            body[u++] = '.';
            if (nd > exp10 + 1)
                u += (size_t)snprintf(body + u, sizeof body - u, "%s", digits + exp10 + 1);
            else
                body[u++] = '0';
            body[u] = '\0';
        }
    } else {
        snprintf(body, sizeof body, "%c%s%se%c%02d", digits[0], nd > 1 ? "." : "", digits + 1,
                 exp10 < 0 ? '-' : '+', abs(exp10));
    }
    snprintf(out, len, "%s%s", neg ? "-" : "", body);
}

/* repr(str) for the ASCII names moe_backend can hold: single quotes unless the text has one and
 * no double quote; backslash escapes; other bytes as \xNN. */
void nvfp4moe_py_str_repr(const char *s, char *out, size_t len) {
    char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    size_t u = 0;
    if (len < 8) { if (len) out[0] = '\0'; return; }
    out[u++] = q;
    for (const unsigned char *p = (const unsigned char *)s; *p && u + 6 < len; p++) {
        if (*p == '\\' || *p == (unsigned char)q) {
            out[u++] = '\\';
            out[u++] = (char)*p;
        } else if (*p < 0x20 || *p >= 0x7f) {
            u += (size_t)snprintf(out + u, len - u, "\\x%02x", *p);
        } else {
            out[u++] = (char)*p;
        }
    }
    out[u++] = q;
    out[u] = '\0';
}


// ---- the string builder ----

void nvfp4moe_sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t avail = b->need < b->len ? b->len - b->need : 0;
    int n = vsnprintf(avail ? b->buf + b->need : NULL, avail, fmt, ap);
    va_end(ap);
    if (n > 0) b->need += (size_t)n;
}
