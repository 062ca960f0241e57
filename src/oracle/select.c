/*
 * select.c - NVFP4 MoE backend selection, a C port of vLLM's select_nvfp4_moe_backend
 * (vllm/model_executor/layers/fused_moe/oracle/nvfp4.py) over the backend table (table.c), with
 * every candidate's reason recorded.
 *
 * Words. A reason is what vLLM's is_supported_config returns, character for character; what vLLM
 * does not say (the device's sm, our scheme name, a library this build lacks) goes into the
 * candidate's detail. The log line is vLLM's, listing vLLM's backends only, and only when vLLM
 * would log it.
 *
 * Availability. vLLM folds "is FlashInfer (or b12x) importable" into _supports_current_device, so
 * there a missing library reads "kernel does not support current device cuda", at the place vLLM
 * checks it; the detail names the library. The libraries vLLM does not check that way (humming,
 * vLLM's CUTLASS ops) and our own implementations are checked after the predicate, in our words:
 * installing or building them would not help a kernel whose predicate says no.
 */
#include "oracle/table.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define N_BACKENDS nvfp4moe_backend_row_count
#define N_LIBS nvfp4moe_oracle_lib_count

// ---- libraries ----

nvfp4moe_status nvfp4moe_oracle_libs_parse(const char *s, uint32_t *mask) {
    NVFP4MOE_RETURN_IF(!s || !mask, NVFP4MOE_ERR_INVALID_ARGUMENT, "installed: NULL argument");
    char accepted[128] = "all, none";
    for (int i = 0; i < N_LIBS; i++) {
        strncat(accepted, ", ", sizeof accepted - strlen(accepted) - 1);
        strncat(accepted, nvfp4moe_oracle_libs[i].cli, sizeof accepted - strlen(accepted) - 1);
    }
    if (!strcasecmp(s, "all")) {
        *mask = NVFP4MOE_LIB_ALL;
        return NVFP4MOE_OK;
    }
    if (!strcasecmp(s, "none")) {
        *mask = 0;
        return NVFP4MOE_OK;
    }
    uint32_t m = 0;
    const char *p = s;
    for (;;) {
        size_t n = strcspn(p, ",");
        bool found = false;
        for (int i = 0; i < N_LIBS; i++) {
            if (strlen(nvfp4moe_oracle_libs[i].cli) == n && !strncasecmp(p, nvfp4moe_oracle_libs[i].cli, n)) {
                m |= nvfp4moe_oracle_libs[i].bit;
                found = true;
            }
        }
        if (!found) {
            char typed[64];
            snprintf(typed, sizeof typed, "%.*s", (int)NVFP4MOE_MIN(n, sizeof typed - 1), p);
            nvfp4moe_suggest sg;
            nvfp4moe_suggest_init(&sg, typed);
            nvfp4moe_suggest_add(&sg, "all");
            nvfp4moe_suggest_add(&sg, "none");
            for (int i = 0; i < N_LIBS; i++) nvfp4moe_suggest_add(&sg, nvfp4moe_oracle_libs[i].cli);
            const char *best = nvfp4moe_suggest_best(&sg);
            return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND, "unknown library '%.*s' (expected "
                                      "one of: %s, or a comma-separated list)%s%s%s", (int)n, p, accepted,
                                      best ? "; did you mean '" : "", best ? best : "", best ? "'?" : "");
        }
        if (!p[n]) break;
        p += n + 1;
    }
    *mask = m;
    return NVFP4MOE_OK;
}

// ---- availability ----

/* A "no" and our context for it (candidate reason and detail). */
typedef struct verdict_text {
    char reason[400];
    char detail[256];
} verdict_text;

#define NO(...) (snprintf(out->reason, sizeof out->reason, __VA_ARGS__), false)

/* Whether vLLM's library for b is present: none is part of this build; what-if, installed. */
static bool lib_present(const backend_def *b, const nvfp4moe_oracle_options *opt) {
    return b->lib == 0 || (opt->installed_set && (opt->installed & b->lib));
}

/* The library vLLM needs for b, or NULL. */
static const lib_def *row_lib(const backend_def *b) {
    for (int i = 0; i < N_LIBS; i++)
        if (b->lib & nvfp4moe_oracle_libs[i].bit) return &nvfp4moe_oracle_libs[i];
    return NULL;
}

/* Whether our implementation of b runs here: in this build, on the device's compute capability; in
 * a CPU-only build planning for a what-if GPU, as a CUDA build's kernels would. */
static bool impl_available(const backend_def *b, const oracle_ctx *c, verdict_text *out) {
    char why[96];
    nvfp4moe_backend_impl planned = {.device_memory = true, .sm_min = b->planned_sm_min, .sm_max = b->planned_sm_max};
    const nvfp4moe_backend_impl *impl = b->impl ? b->impl : &planned;
    if (impl->device_memory && !c->dev->is_cuda)
        return NO("the %s implementation is not available for this device: it runs on CUDA GPUs (device is %s)",
                  b->name, c->dev_str);
    if (c->dev->is_cuda && !nvfp4moe_impl_runs_on_sm(impl, c->dev->sm, why, sizeof why))
        return NO("the %s implementation is not available for this device: %s", b->name, why);
    if (b->impl) return true;
    if (!c->dev->detected) {
        snprintf(out->detail, sizeof out->detail, "planned as a CUDA build would run it (this is a %s)",
                 b->not_built ? b->not_built : "CPU-only build");
        return true;
    }
    return NO("the %s implementation is not available in this build (%s)", b->name,
              b->not_built ? b->not_built : "CPU-only build");
}

// ---- the predicate ----

/* FusedMoEExperts.is_supported_config (fused_moe/modular_kernel.py) with the class's own gates
 * before (pre) and after (extra) it: vLLM's checks in vLLM's order, stopping at the first failure.
 * Hash routing and _supports_shape never fail for our configs and are not modelled. lib_ok: the
 * row's library is present (checked with the device where vLLM checks it there). */
static bool kernel_supported(const kernel_def *k, const backend_def *b, const oracle_ctx *c, bool lib_ok,
                             verdict_text *out) {
    const nvfp4moe_config *cfg = c->cfg;
    bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    char buf[320];
    out->reason[0] = out->detail[0] = '\0';
    if (k->pre && !k->pre(c, out->reason, sizeof out->reason)) return false;
    bool dev_ok = k->device ? k->device(c->dev)
                            : c->dev->is_cuda && c->dev->sm >= k->sm_min && (k->sm_max == 0 || c->dev->sm <= k->sm_max);
    if (!dev_ok || (k->lib_in_device_check && !lib_ok)) {
        if (!dev_ok && c->dev->is_cuda && strcmp(c->dev->name, c->dev_str))
            snprintf(out->detail, sizeof out->detail, "device %s (%s)", c->dev_str, c->dev->name);
        else if (!dev_ok && c->dev->is_cuda)
            snprintf(out->detail, sizeof out->detail, "device %s", c->dev_str);
        else if (dev_ok)
            snprintf(out->detail, sizeof out->detail, "%s is not available in this build (--installed %s "
                     "plans as if it were)", row_lib(b)->what, row_lib(b)->cli);
        return NO("kernel does not support current device %s", nvfp4moe_platform_device_name(c->dev));
    }
    if (!gated && !k->no_act_and_mul)
        return NO("kernel does not support no act_and_mul MLP layer");
    if (!(k->activations & (1u << cfg->activation))) {
        nvfp4moe_activation_enum_str(cfg->activation, buf, sizeof buf);
        return NO("kernel does not support %s activation", buf);
    }
    if (!(k->schemes & (1u << c->scheme)) || (k->quant_rule && !k->quant_rule(c, buf, sizeof buf))) {
        snprintf(out->detail, sizeof out->detail, "scheme %s", nvfp4moe_scheme_name(c->scheme));
        nvfp4moe_quant_scheme_str(c->scheme, buf, sizeof buf);
        return NO("kernel does not support quantization scheme %s", buf);
    }
    if (k->parallel && !k->parallel(c)) {
        nvfp4moe_parallel_str(c, buf, sizeof buf);
        return NO("kernel does not support parallel config %s", buf);
    }
    if (k->monolithic && !(k->routings & (1u << cfg->routing))) {
        snprintf(out->detail, sizeof out->detail, "routing %s (%s)", nvfp4moe_routing_name(cfg->routing),
                 nvfp4moe_routing_type_name(cfg->routing));
        return NO("kernel does not support routing method %d", nvfp4moe_routing_type_value(cfg->routing));
    }
    if (k->monolithic && !(k->logits_dtypes & (1u << cfg->router_logits_dtype)))
        return NO("kernel does not support router logits dtype %s", nvfp4moe_torch_dtype_name(cfg->router_logits_dtype));
    if (c->batched != k->batched)
        return NO("kernel does not support %s activation format", nvfp4moe_activation_format_str(c->batched));
    if (cfg->batch_invariant && !k->batch_invariant)
        return NO("kernel does not support batch invariance");
    if (cfg->lora && !k->lora)
        return NO("kernel does not support LoRA");
    if (k->extra && !k->extra(c, out->reason, sizeof out->reason)) return false;
    return true;
}

/* The predicate, then what vLLM does not check there: a library it imports elsewhere, and our
 * implementations (see the top of the file). */
static bool kernel_runs(const backend_def *b, const kernel_def *k, const oracle_ctx *c,
                        const nvfp4moe_oracle_options *opt, verdict_text *out) {
    bool lib_ok = lib_present(b, opt);
    if (!kernel_supported(k, b, c, lib_ok, out)) return false;
    if (!lib_ok) {
        snprintf(out->detail, sizeof out->detail, "--installed %s plans as if it were", row_lib(b)->cli);
        return NO("%s is not available in this build", row_lib(b)->what);
    }
    /* What-if: vLLM's own kernels (MARLIN, EMULATION) come with vLLM; ours are planned as this
     * library's kernels run. */
    bool vllm_has_it = opt->installed_set && !b->ours;
    if ((b->impl || b->planned_sm_min) && !vllm_has_it && !impl_available(b, c, out)) return false;
    out->reason[0] = '\0';
    return true;
}

// ---- the report's rows ----

static void add_candidate(nvfp4moe_report *r, const backend_def *b, const kernel_def *k,
                          nvfp4moe_verdict v, bool supported, const char *reason, const char *detail) {
    if (r->n_candidates >= NVFP4MOE_MAX_CANDIDATES) return; /* the table is far smaller */
    nvfp4moe_candidate *cd = &r->candidates[r->n_candidates++];
    nvfp4moe_strlcpy(cd->backend, b->name, sizeof cd->backend);
    nvfp4moe_strlcpy(cd->kernel, k->name, sizeof cd->kernel);
    cd->verdict = v;
    cd->supported = supported;
    nvfp4moe_strlcpy(cd->reason, reason, sizeof cd->reason);
    nvfp4moe_strlcpy(cd->detail, detail, sizeof cd->detail);
}

/* Appends every kernel of b as NOT_IN_LIST: why it was no candidate, then what its predicate
 * would have said (so a what-if user sees e.g. that an explicit-only backend would run). */
static void add_not_in_list(nvfp4moe_report *r, const backend_def *b, const oracle_ctx *c,
                            const nvfp4moe_oracle_options *opt, const char *why) {
    for (int j = 0; j < MAX_KERNELS && b->kernels[j]; j++) {
        verdict_text v;
        char reason[sizeof r->candidates[0].reason];
        bool ok = kernel_runs(b, b->kernels[j], c, opt, &v);
        if (ok)
            snprintf(reason, sizeof reason, "%s; would be supported", why);
        else
            snprintf(reason, sizeof reason, "%s; would be rejected: %s", why, v.reason);
        add_candidate(r, b, b->kernels[j], NVFP4MOE_VERDICT_NOT_IN_LIST, ok, reason, v.detail);
    }
}


// ---- selection ----

static bool visible(const backend_def *b, const nvfp4moe_oracle_options *opt) {
    return !(opt->vllm_only && b->ours);
}

/* The seed's AVAILABLE_BACKENDS (ours appended unless vllm_only): rows with an auto rank, by
 * rank, then moved by their rank rules (prioritize_humming is one). Returns the count. */
static int auto_list(const oracle_ctx *c, const nvfp4moe_oracle_options *opt, const backend_def **out) {
    int n = 0;
    for (int i = 0; i < N_BACKENDS; i++)
        if (nvfp4moe_backend_rows[i].auto_rank > 0 && visible(&nvfp4moe_backend_rows[i], opt)) out[n++] = &nvfp4moe_backend_rows[i];
    /* Insertion sort: stable, so equal ranks keep table order. */
    for (int i = 1; i < n; i++) {
        const backend_def *x = out[i];
        int j = i - 1;
        for (; j >= 0 && out[j]->auto_rank > x->auto_rank; j--) out[j + 1] = out[j];
        out[j + 1] = x;
    }
    /* Then each row's rank rule, in table order. */
    for (int r = 0; r < N_BACKENDS; r++) {
        const backend_def *b = &nvfp4moe_backend_rows[r];
        char why[320];
        rank_move mv = b->rank ? b->rank->move(c, why, sizeof why) : RANK_KEEP;
        if (mv == RANK_KEEP) continue;
        int h = -1, m = -1;
        for (int i = 0; i < n; i++) {
            if (out[i] == b) h = i;
            if (!strcmp(out[i]->name, b->rank->anchor)) m = i;
        }
        if (mv == RANK_BEFORE && h > m && m >= 0) {
            for (int i = h; i > m; i--) out[i] = out[i - 1];
            out[m] = b;
        } else if (mv == RANK_AFTER && h >= 0 && m > h) {
            for (int i = h; i < m; i++) out[i] = out[i + 1];
            out[m] = b;
        }
    }
    return n;
}

/* vLLM's info line: "Using 'X' NvFp4 MoE backend out of potential backends: ['A', 'B']." with
 * Python's repr of the list of vLLM's backends (ours are not among vLLM's). */
static void make_log(nvfp4moe_report *r, const backend_def *chosen, const backend_def *const *list, int n) {
    char l[512];
    sbuf b = {l, sizeof l, 0};
    int k = 0;
    nvfp4moe_sb_printf(&b, "[");
    for (int i = 0; i < n; i++)
        if (!list[i]->ours) nvfp4moe_sb_printf(&b, "%s'%s'", k++ ? ", " : "", list[i]->name);
    nvfp4moe_sb_printf(&b, "]");
    snprintf(r->log, sizeof r->log, "Using '%s' NvFp4 MoE backend out of potential backends: %s.",
             chosen->name, l);
}

static nvfp4moe_status raise_error(nvfp4moe_report *r, nvfp4moe_status st, const char *kind, const char *msg) {
    nvfp4moe_strlcpy(r->error_kind, kind, sizeof r->error_kind);
    nvfp4moe_strlcpy(r->error, msg, sizeof r->error);
    return nvfp4moe_set_error(st, "%s", msg);
}

/* Tries b's kernels in order, recording each; returns the index of the first that runs (-1: none)
 * and leaves the last reason in last_reason. first_wins: the first that runs is CHOSEN (else all
 * that run are SUPPORTED, a higher-priority backend having won). */
static int try_backend(nvfp4moe_report *r, const backend_def *b, const oracle_ctx *c,
                       const nvfp4moe_oracle_options *opt, bool first_wins, char *last_reason, size_t len) {
    int chosen = -1;
    last_reason[0] = '\0';
    for (int j = 0; j < MAX_KERNELS && b->kernels[j]; j++) {
        verdict_text v;
        bool ok = kernel_runs(b, b->kernels[j], c, opt, &v);
        nvfp4moe_verdict verdict = NVFP4MOE_VERDICT_REJECTED;
        if (ok && first_wins && chosen < 0) {
            verdict = NVFP4MOE_VERDICT_CHOSEN;
            chosen = j;
            nvfp4moe_strlcpy(r->backend, b->name, sizeof r->backend);
            nvfp4moe_strlcpy(r->kernel, b->kernels[j]->name, sizeof r->kernel);
        } else if (ok) {
            verdict = NVFP4MOE_VERDICT_SUPPORTED;
            if (chosen < 0 && !first_wins) chosen = j;
        }
        if (chosen < 0) nvfp4moe_strlcpy(last_reason, v.reason, len);
        add_candidate(r, b, b->kernels[j], verdict, ok, ok ? "" : v.reason, v.detail);
    }
    return chosen;
}

static bool in_list(const backend_def *b, const backend_def *const *list, int n) {
    for (int i = 0; i < n; i++)
        if (list[i] == b) return true;
    return false;
}

static bool reported(const nvfp4moe_report *r, const backend_def *b) {
    for (int k = 0; k < r->n_candidates; k++)
        if (!strcmp(r->candidates[k].backend, b->name)) return true;
    return false;
}

/* Records, as NOT_IN_LIST, every backend not yet in the report: first those of the auto list in
 * its order, then the others in table order. In auto mode the others say why they were no
 * candidate (the clamp filter, explicit-only); otherwise every one gets why. */
static void add_rest(nvfp4moe_report *r, const oracle_ctx *c, const nvfp4moe_oracle_options *opt,
                     const backend_def *const *list, int n, const backend_def *const *filtered, int nf,
                     bool auto_mode, const char *why) {
    for (int i = 0; i < n; i++)
        if (!reported(r, list[i])) add_not_in_list(r, list[i], c, opt, why);
    for (int i = 0; i < N_BACKENDS; i++) {
        const backend_def *b = &nvfp4moe_backend_rows[i];
        if (!visible(b, opt) || reported(r, b)) continue;
        char own[200];
        if (auto_mode && in_list(b, filtered, nf))
            snprintf(own, sizeof own, "removed from the auto list by swiglu_limit: does not apply the SwiGLU clamp");
        else if (auto_mode && b->auto_rank == 0 && b->moe_backend)
            snprintf(own, sizeof own, "explicit-only, not in the auto list (request it with moe_backend='%s')",
                     b->moe_backend);
        else if (auto_mode)
            snprintf(own, sizeof own, "not in the auto list");
        else
            nvfp4moe_strlcpy(own, why, sizeof own);
        add_not_in_list(r, b, c, opt, own);
    }
}

/* What vLLM itself does when one of ours won the auto list: the first of vLLM's kernels that runs,
 * in list order (ours never push one of vLLM's aside, they only go first). */
static void note_vllm_choice(nvfp4moe_report *r, const backend_def *chosen) {
    const nvfp4moe_candidate *v = NULL;
    for (int k = 0; k < r->n_candidates && !v; k++) {
        const nvfp4moe_candidate *cd = &r->candidates[k];
        const backend_def *b = nvfp4moe_backend_row(cd->backend);
        if (cd->supported && cd->verdict != NVFP4MOE_VERDICT_NOT_IN_LIST && b && !b->ours) v = cd;
    }
    if (v)
        snprintf(r->detail, sizeof r->detail, "%s is ours, not vLLM's: vLLM logs no line for it; vLLM itself "
                 "would choose %s (%s)", chosen->name, v->backend, v->kernel);
    else
        snprintf(r->detail, sizeof r->detail, "%s is ours, not vLLM's: vLLM logs no line for it; vLLM itself "
                 "would raise NotImplementedError", chosen->name);
}

const char *nvfp4moe_vllm_revision(void) { return NVFP4MOE_VLLM_REVISION; }

nvfp4moe_status nvfp4moe_select(const nvfp4moe_config *cfg, const nvfp4moe_device *dev,
                                const nvfp4moe_oracle_options *opt_in, nvfp4moe_report *r) {
    NVFP4MOE_RETURN_IF(!r, NVFP4MOE_ERR_INVALID_ARGUMENT, "select: report is NULL");
    memset(r, 0, sizeof *r);
    NVFP4MOE_RETURN_IF(!cfg, NVFP4MOE_ERR_INVALID_ARGUMENT, "select: config is NULL");
    NVFP4MOE_RETURN_IF(!memchr(cfg->moe_backend, '\0', sizeof cfg->moe_backend),
                       NVFP4MOE_ERR_INVALID_ARGUMENT, "moe_backend is not NUL-terminated");
    /* Validate everything but the name: an unknown name is the oracle's ValueError, below. */
    nvfp4moe_config vc = *cfg;
    nvfp4moe_strlcpy(vc.moe_backend, cfg->moe_backend[0] ? "auto" : "", sizeof vc.moe_backend);
    NVFP4MOE_TRY(nvfp4moe_config_validate(&vc));

    nvfp4moe_oracle_options opt = {0};
    if (opt_in) opt = *opt_in;
    nvfp4moe_device detected;
    if (!dev) {
        NVFP4MOE_TRY(nvfp4moe_device_detect(&detected));
        dev = &detected;
    }

    oracle_ctx c = {.cfg = cfg, .dev = dev, .scheme = cfg->scheme};
    const nvfp4moe_parallel *p = &cfg->parallel;
    c.use_ep = p->ep_size > 1;
    c.use_all2all = nvfp4moe_config_uses_all2all(cfg);
    c.batched = nvfp4moe_config_batched_format(cfg);
    nvfp4moe_device_str(dev, c.dev_str, sizeof c.dev_str);
    nvfp4moe_strlcpy(r->device, c.dev_str, sizeof r->device);

    /* vLLM's config validator: value.lower().replace("-", "_"). */
    char name[sizeof cfg->moe_backend];
    for (size_t i = 0; i < sizeof name; i++) {
        char ch = (char)tolower((unsigned char)cfg->moe_backend[i]);
        name[i] = ch == '-' ? '_' : ch;
        if (!ch) break;
    }
    nvfp4moe_strlcpy(r->requested, name, sizeof r->requested);

    /* The auto list, prioritize_humming, then the SwiGLU clamp filter. vLLM builds it after the
     * requantization check; it has no side effect, and the report lists candidates in its order. */
    const backend_def *all[MAX_BACKENDS], *list[MAX_BACKENDS], *filtered[MAX_BACKENDS];
    int n_all = auto_list(&c, &opt, all), n = 0, nf = 0;
    for (int i = 0; i < n_all; i++) {
        if (cfg->has_swiglu_limit && !all[i]->clamp)
            filtered[nf++] = all[i];
        else
            list[n++] = all[i];
    }

    /* 1. A requantization source gets EMULATION at once, before any check or name lookup. */
    if (cfg->requantization_source) {
        const backend_def *emu = nvfp4moe_backend_row("EMULATION");
        verdict_text avail = {{0}, {0}};
        bool ok = impl_available(emu, &c, &avail);
        char why[sizeof r->candidates[0].reason];
        snprintf(why, sizeof why, "the layer is a requantization source: vLLM returns EMULATION without "
                 "checking it%s%s", ok ? "" : "; note: ", ok ? "" : avail.reason);
        add_candidate(r, emu, emu->kernels[0], NVFP4MOE_VERDICT_CHOSEN, true, why, avail.detail);
        nvfp4moe_strlcpy(r->backend, emu->name, sizeof r->backend);
        nvfp4moe_strlcpy(r->kernel, emu->kernels[0]->name, sizeof r->kernel);
        add_rest(r, &c, &opt, list, n, filtered, nf, false, "not considered: the layer is a requantization source");
        return NVFP4MOE_OK;
    }

    /* 2. map_nvfp4_backend. */
    const backend_def *req = NULL;
    if (strcmp(name, "auto") != 0) {
        for (int i = 0; i < N_BACKENDS; i++)
            if (nvfp4moe_backend_rows[i].moe_backend && visible(&nvfp4moe_backend_rows[i], &opt) && !strcmp(nvfp4moe_backend_rows[i].moe_backend, name))
                req = &nvfp4moe_backend_rows[i];
        if (!req) {
            /* The mapping's keys: vLLM's in its order, then ours. */
            char keys[400], msg[640];
            sbuf kb = {keys, sizeof keys, 0};
            int nk = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int i = 0; i < N_BACKENDS; i++)
                    if (nvfp4moe_backend_rows[i].moe_backend && visible(&nvfp4moe_backend_rows[i], &opt) && nvfp4moe_backend_rows[i].ours == (pass == 1))
                        nvfp4moe_sb_printf(&kb, "%s'%s'", nk++ ? ", " : "[", nvfp4moe_backend_rows[i].moe_backend);
            nvfp4moe_sb_printf(&kb, "]");
            snprintf(msg, sizeof msg, "moe_backend='%s' is not supported for NvFP4 MoE. Expected one of %s.",
                     name, keys);
            /* Ours, never in vLLM's words: the nearest known name, as a note. */
            nvfp4moe_suggest sg;
            nvfp4moe_suggest_init(&sg, name);
            for (int i = 0; i < N_BACKENDS; i++)
                if (nvfp4moe_backend_rows[i].moe_backend && visible(&nvfp4moe_backend_rows[i], &opt))
                    nvfp4moe_suggest_add(&sg, nvfp4moe_backend_rows[i].moe_backend);
            if (nvfp4moe_suggest_best(&sg))
                snprintf(r->detail, sizeof r->detail, "did you mean moe_backend='%s'?", nvfp4moe_suggest_best(&sg));
            char why[96];
            snprintf(why, sizeof why, "not considered: moe_backend='%.40s' is unknown", name);
            add_rest(r, &c, &opt, list, n, filtered, nf, false, why);
            return raise_error(r, NVFP4MOE_ERR_NOT_FOUND, "ValueError", msg);
        }
    }

    if (req) {
        /* 3. Explicit request. B12X runs with bf16 activations when forced: no activation key. */
        if (req->a16_when_forced && cfg->force_a16) c.scheme = NVFP4MOE_SCHEME_W4A16;
        const backend_def *asked = req;
        if (c.batched && req->batched_as) req = nvfp4moe_backend_row(req->batched_as);
        char name_repr[96], why[200];
        nvfp4moe_py_str_repr(name, name_repr, sizeof name_repr);
        if (req != asked)
            snprintf(why, sizeof why, "not requested (moe_backend=%s became %s under the BatchedExperts "
                     "activation format)", name_repr, req->name);
        else
            snprintf(why, sizeof why, "not requested (moe_backend=%s)", name_repr);
        if (req->ours)
            snprintf(r->detail, sizeof r->detail, "%s is ours, not vLLM's: vLLM rejects moe_backend=%s as unknown "
                     "(ValueError)", req->name, name_repr);

        if (cfg->has_swiglu_limit && !req->clamp) {
            char lim[80], msg[640];
            nvfp4moe_py_float_repr(cfg->swiglu_limit, lim, sizeof lim);
            snprintf(msg, sizeof msg,
                     "Model sets swiglu_limit=%s, but the explicitly requested moe_backend=%s does not "
                     "apply the SwiGLU clamp. Use 'flashinfer_trtllm', 'flashinfer_cutlass', "
                     "'flashinfer_cutedsl', 'flashinfer_moe_ep_cutedsl', 'cutlass', 'b12x', 'marlin', "
                     "or 'humming' instead.", lim, name_repr);
            for (int j = 0; j < MAX_KERNELS && req->kernels[j]; j++)
                add_candidate(r, req, req->kernels[j], NVFP4MOE_VERDICT_REJECTED, false,
                              "requested, but not in the SwiGLU clamp set while swiglu_limit is set", "");
            add_rest(r, &c, &opt, list, n, filtered, nf, false, why);
            return raise_error(r, NVFP4MOE_ERR_UNSUPPORTED, "ValueError", msg);
        }

        char last[400];
        int k = try_backend(r, req, &c, &opt, true, last, sizeof last);
        add_rest(r, &c, &opt, list, n, filtered, nf, false, why);
        if (k >= 0) {
            if (!req->ours) make_log(r, req, list, n);
            /* B12xExperts refuses a router weight applied on the input with activations it quantizes
             * only when the weights are loaded (process_weights_after_loading), after this choice. */
            if (!strcmp(req->name, "B12X") && cfg->apply_router_weight_on_input && c.scheme != NVFP4MOE_SCHEME_W4A16)
                snprintf(r->detail, sizeof r->detail, "vLLM chooses B12X, then B12xExperts raises at weight loading: "
                         "ValueError: b12x MoE supports apply_router_weight_on_input only with W4A16");
            return NVFP4MOE_OK;
        }
        char msg[640];
        if (last[0])
            snprintf(msg, sizeof msg, "NvFp4 MoE backend '%s' does not support the deployment configuration "
                     "since %s.", req->name, last);
        else
            snprintf(msg, sizeof msg, "NvFp4 MoE backend '%s' does not support the deployment configuration.",
                     req->name);
        return raise_error(r, NVFP4MOE_ERR_UNSUPPORTED, "ValueError", msg);
    }

    /* 4. Auto: the first kernel that runs, in list order. The rest are still evaluated, for the
     * report (vLLM stops at the first). */
    const backend_def *chosen = NULL;
    for (int i = 0; i < n; i++) {
        char last[400];
        if (try_backend(r, list[i], &c, &opt, chosen == NULL, last, sizeof last) >= 0 && !chosen)
            chosen = list[i];
    }
    add_rest(r, &c, &opt, list, n, filtered, nf, true, "");
    /* A row its rank rule demoted says so where it runs (the list order alone would not). */
    for (int i = 0; i < N_BACKENDS; i++) {
        const backend_def *b = &nvfp4moe_backend_rows[i];
        char why[sizeof r->candidates[0].detail] = "";
        if (!b->rank || b->rank->move(&c, why, sizeof why) == RANK_KEEP || !why[0]) continue;
        for (int k = 0; k < r->n_candidates; k++) {
            nvfp4moe_candidate *cd = &r->candidates[k];
            if (!strcmp(cd->backend, b->name) && cd->verdict == NVFP4MOE_VERDICT_SUPPORTED)
                nvfp4moe_strlcpy(cd->detail, why, sizeof cd->detail);
        }
    }
    if (chosen && chosen->ours) {
        note_vllm_choice(r, chosen);
        return NVFP4MOE_OK;
    }
    if (chosen) {
        make_log(r, chosen, list, n);
        return NVFP4MOE_OK;
    }
    return raise_error(r, NVFP4MOE_ERR_UNSUPPORTED, "NotImplementedError",
                 "No NvFp4 MoE backend supports the deployment configuration.");
}
