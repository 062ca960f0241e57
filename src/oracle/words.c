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
//
// FusedMoEExperts.is_supported_config (fused_moe/modular_kernel.py) formats each value with an
// f-string; these are what those f-strings print.

const char *nvfp4moe_platform_device_name(const nvfp4moe_device *dev) {
    return dev && dev->is_cuda ? "cuda" : "cpu";
}

/* MoEActivation (fused_moe/activation.py) is a plain Enum whose member names are the values in
 * upper case, so str() is "MoEActivation." + the upper-case name. */
void nvfp4moe_activation_enum_str(nvfp4moe_activation a, char *buf, size_t len) {
    char up[40];
    const char *name = nvfp4moe_activation_name(a);
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof up; i++) up[i] = (char)toupper((unsigned char)name[i]);
    up[i] = '\0';
    snprintf(buf, len, "MoEActivation.%s", up);
}

/* RoutingMethodType (fused_moe/config.py): Default = 0, Renormalize = 1, DeepSeekV3 = 2, Llama4 = 3,
 * RenormalizeNaive = 4, TopK = 5, SigmoidRenorm = 6, MiniMax2 = 7, Sigmoid = 8, Unspecified = 9,
 * Simulated = 102. */
int nvfp4moe_routing_type_value(nvfp4moe_routing r) {
    switch (r) {
    case NVFP4MOE_ROUTING_SOFTMAX_TOPK:      return 0;
    case NVFP4MOE_ROUTING_RENORMALIZE:       return 1;
    case NVFP4MOE_ROUTING_DEEPSEEK_V3:       return 2;
    case NVFP4MOE_ROUTING_LLAMA4:            return 3;
    case NVFP4MOE_ROUTING_RENORMALIZE_NAIVE: return 4;
    case NVFP4MOE_ROUTING_SIGMOID_RENORM:    return 6;
    case NVFP4MOE_ROUTING_MINIMAX2:          return 7;
    case NVFP4MOE_ROUTING_SIGMOID:           return 8;
    case NVFP4MOE_ROUTING_SIMULATED:         return 102;
    case NVFP4MOE_ROUTING_COUNT:             break;
    }
    return 9;
}

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

/* QuantKey.__str__ and ScaleDesc.__str__ (quantization/utils/quant_utils.py) of the constants the
 * NVFP4 MoE methods pass: FP4 data travels as torch.uint8 ("u8"), its block scales as
 * float8_e4m3fn per GroupShape(1, 16), the global scale as a float32 scale2; MXFP8 is
 * float8_e4m3fn data with uint8 (E8M0) scales per GroupShape(1, 32). GroupShape prints as the
 * NamedTuple it is. */
#define QK_NVFP4(scale, scale2) "QuantKey(u8,scale(f8e4m3fn," scale ",GroupShape(row=1, col=16)),scale2(" scale2 "),symmetric)"
#define QK_NVFP4_STATIC QK_NVFP4("static", "f32,static,per_tensor")
#define QK_NVFP4_DYNAMIC QK_NVFP4("dynamic", "f32,static,per_tensor")
#define QK_NVFP4_DYNAMIC_TOKEN QK_NVFP4("dynamic", "f32,dynamic,per_token")
#define QK_MXFP8_DYNAMIC "QuantKey(f8e4m3fn,scale(u8,dynamic,GroupShape(row=1, col=32)),symmetric)"

void nvfp4moe_quant_scheme_str(nvfp4moe_scheme s, char *buf, size_t len) {
    const char *a = "None";
    switch (s) {
    case NVFP4MOE_SCHEME_W4A4:           a = QK_NVFP4_DYNAMIC; break;
    case NVFP4MOE_SCHEME_W4A4_PER_TOKEN: a = QK_NVFP4_DYNAMIC_TOKEN; break;
    case NVFP4MOE_SCHEME_W4A16:          a = "None"; break;
    case NVFP4MOE_SCHEME_W4A8_MXFP8:     a = QK_MXFP8_DYNAMIC; break;
    case NVFP4MOE_SCHEME_COUNT:          break;
    }
    snprintf(buf, len, "%sx%s", QK_NVFP4_STATIC, a);
}

/* FusedMoEParallelConfig.make (fused_moe/config.py) flattens TP across DP: without EP, tp_size is
 * dp * tp and ep_size 1; with EP, tp_size is 1 and the experts are split over ep_size ranks, this
 * one being ep_rank (its DP rank is ep_rank over the TP ranks per DP rank). No prefill context or
 * sequence parallelism here: pcp_size = sp_size = 1. vLLM's all2all backend defaults to
 * "allgather_reducescatter"; the dataclass repr prints every field. */
void nvfp4moe_parallel_str(const oracle_ctx *c, char *buf, size_t len) {
    const nvfp4moe_parallel *p = &c->cfg->parallel;
    int tp = c->use_ep ? 1 : (int)(p->tp_size * p->dp_size);
    int ep = c->use_ep ? (int)p->ep_size : 1;
    int ep_rank = c->use_ep ? (int)p->ep_rank : 0;
    int per_dp = p->dp_size > 0 && p->ep_size % p->dp_size == 0 ? (int)(p->ep_size / p->dp_size) : 0;
    int dp_rank = c->use_ep && per_dp > 0 ? ep_rank / per_dp : 0;
    snprintf(buf, len,
             "FusedMoEParallelConfig(tp_size=%d, pcp_size=1, dp_size=%d, ep_size=%d, tp_rank=0, "
             "pcp_rank=0, dp_rank=%d, ep_rank=%d, sp_size=1, use_ep=%s, all2all_backend='%s', "
             "enable_eplb=%s)",
             tp, (int)p->dp_size, ep, dp_rank, ep_rank, c->use_ep ? "True" : "False",
             p->all2all[0] ? p->all2all : "allgather_reducescatter", p->eplb ? "True" : "False");
}

/* FusedMoEActivationFormat (modular_kernel.py): Standard = ("standard",), BatchedExperts =
 * ("batched_experts",); the reason formats .value, the tuple. */
const char *nvfp4moe_activation_format_str(bool batched) {
    return batched ? "('batched_experts',)" : "('standard',)";
}

// ---- Python's repr, for the messages vLLM formats with f-strings ----

/* repr(float): the shortest digits that read back as the same double (what Python prints for the
 * number the model's config gave), fixed notation for 1e-4 <= |x| < 1e16 with at least ".0", else
 * "1e-05" / "1.5e+16". */
void nvfp4moe_py_float_repr(double x, char *out, size_t len) {
    if (isnan(x)) { nvfp4moe_strlcpy(out, "nan", len); return; }
    if (isinf(x)) { nvfp4moe_strlcpy(out, x < 0 ? "-inf" : "inf", len); return; }
    if (x == 0) { nvfp4moe_strlcpy(out, signbit(x) ? "-0.0" : "0.0", len); return; }
    char e[48];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e = "[-]d.ddde[+-]XX": split into sign, digits, exponent. */
    bool neg = e[0] == '-';
    const char *m = e + neg;
    char digits[24];
    int nd = 0;
    for (const char *q = m; *q && *q != 'e' && nd < 23; q++)
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
