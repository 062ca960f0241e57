/*
 * plan.c - plans: the oracle's choice, prepared for one layer's weights by the implementation the
 * backend table gives that row.
 */
#include "oracle/oracle.h"

#include <stdlib.h>
#include <string.h>

// ---- plans ----

struct nvfp4moe_plan {
    const nvfp4moe_backend_impl *impl;
    void *state;
    nvfp4moe_config cfg;
    nvfp4moe_report report;
};

nvfp4moe_status nvfp4moe_plan_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                     const nvfp4moe_plan_options *opt, nvfp4moe_plan **out) {
    NVFP4MOE_RETURN_IF(!out, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_plan_create: out is NULL");
    NVFP4MOE_RETURN_IF(!cfg || !w, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_plan_create: %s is NULL",
                       !cfg ? "cfg" : "w");
    NVFP4MOE_TRY(nvfp4moe_config_validate(cfg));
    /* The oracle answers for a deployment; a plan computes one layer on one device. Two deployment
     * features have no meaning there and must not be ignored silently. */
    NVFP4MOE_RETURN_IF(cfg->lora, NVFP4MOE_ERR_UNSUPPORTED,
                       "lora is set, but nvfp4moe's layer API has no LoRA adapters to apply "
                       "(nvfp4moe select plans LoRA deployments)");
    NVFP4MOE_RETURN_IF(cfg->parallel.ep_size > 1, NVFP4MOE_ERR_UNSUPPORTED,
                       "parallel.ep_size=%d: a plan runs every expert of the layer on one device; expert "
                       "parallelism goes through nvfp4moe_ep_plan_create", cfg->parallel.ep_size);
    nvfp4moe_plan_options o = {0};
    if (opt) o = *opt;
    NVFP4MOE_RETURN_IF(o.backend && strlen(o.backend) >= sizeof cfg->moe_backend, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "backend name '%s' is too long", o.backend);
    NVFP4MOE_RETURN_IF(o.num_threads < 0, NVFP4MOE_ERR_INVALID_ARGUMENT, "num_threads=%d is negative",
                       (int)o.num_threads);

    nvfp4moe_plan *plan = calloc(1, sizeof *plan);
    NVFP4MOE_RETURN_IF(!plan, NVFP4MOE_ERR_OUT_OF_MEMORY, "nvfp4moe_plan_create: out of memory");
    if (nvfp4moe_handle_add(plan, NVFP4MOE_HANDLE_PLAN) != NVFP4MOE_OK) {
        free(plan);
        return NVFP4MOE_ERR_OUT_OF_MEMORY;
    }
    plan->cfg = *cfg;
    if (o.backend) nvfp4moe_strlcpy(plan->cfg.moe_backend, o.backend, sizeof plan->cfg.moe_backend);
    nvfp4moe_device dev;
    nvfp4moe_status st = o.device ? NVFP4MOE_OK : nvfp4moe_device_detect(&dev);
    if (o.device) dev = *o.device;
    if (st == NVFP4MOE_OK) {
        st = nvfp4moe_select(&plan->cfg, &dev, o.oracle, &plan->report);
        if (st != NVFP4MOE_OK && plan->report.error[0])
            nvfp4moe_set_error(st, "%s: %s", plan->report.error_kind, plan->report.error);
    }
    if (st == NVFP4MOE_OK) {
        plan->impl = nvfp4moe_backend_impl_find(plan->report.backend);
        if (!plan->impl)
            st = nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED,
                                    "the oracle chose %s, but this build cannot run it (no implementation compiled in)",
                                    plan->report.backend);
    }
    if (st == NVFP4MOE_OK && !o.weights_on_device) st = nvfp4moe_weights_validate(&plan->cfg, w);
    if (st == NVFP4MOE_OK) st = plan->impl->create(&plan->cfg, w, &o, &dev, &plan->state);
    if (st != NVFP4MOE_OK) {
        nvfp4moe_plan_destroy(plan);   // no backend state yet
        return st;
    }
    *out = plan;
    return NVFP4MOE_OK;
}

const char *nvfp4moe_plan_backend(const nvfp4moe_plan *plan) { return plan ? plan->report.backend : ""; }
const char *nvfp4moe_plan_kernel(const nvfp4moe_plan *plan) { return plan ? plan->report.kernel : ""; }
const nvfp4moe_report *nvfp4moe_plan_report(const nvfp4moe_plan *plan) { return plan ? &plan->report : NULL; }
bool nvfp4moe_plan_uses_device_memory(const nvfp4moe_plan *plan) { return plan && plan->impl->device_memory; }

void *nvfp4moe_plan_backend_state(const nvfp4moe_plan *plan, const nvfp4moe_backend_impl *impl) {
    return plan && nvfp4moe_handle_live(plan, NVFP4MOE_HANDLE_PLAN) && plan->impl == impl ? plan->state : NULL;
}

nvfp4moe_scheme nvfp4moe_plan_effective_scheme(const nvfp4moe_plan *plan) {
    if (!plan) return NVFP4MOE_SCHEME_COUNT;   // its name is "?"
    return plan->impl->effective_scheme(plan->cfg.scheme);
}

size_t nvfp4moe_plan_workspace_size(const nvfp4moe_plan *plan, int64_t num_tokens) {
    if (!plan || num_tokens < 0) return 0;
    return plan->impl->workspace_size(plan->state, num_tokens);
}

nvfp4moe_status nvfp4moe_plan_forward(nvfp4moe_plan *plan, const nvfp4moe_io *io, void *stream) {
    NVFP4MOE_RETURN_IF(!plan || !io, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_plan_forward: %s is NULL",
                       !plan ? "plan" : "io");
    NVFP4MOE_RETURN_IF(!nvfp4moe_handle_live(plan, NVFP4MOE_HANDLE_PLAN), NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "nvfp4moe_plan_forward: plan is not a live plan (destroyed already, or never created)");
    NVFP4MOE_RETURN_IF(io->num_tokens < 0, NVFP4MOE_ERR_SHAPE, "io.num_tokens=%lld is negative",
                       (long long)io->num_tokens);
    size_t need = plan->impl->workspace_size(plan->state, io->num_tokens);
    NVFP4MOE_RETURN_IF(need > 0 && (!io->workspace || io->workspace_size < need), NVFP4MOE_ERR_BUFFER_TOO_SMALL,
                       "io.workspace: %zu bytes given, %zu needed for %lld tokens on %s",
                       io->workspace ? io->workspace_size : (size_t)0, need, (long long)io->num_tokens,
                       plan->report.backend);
    return plan->impl->forward(plan->state, io, stream);
}

nvfp4moe_status nvfp4moe_plan_run(nvfp4moe_plan *plan, int64_t num_tokens, const void *hidden,
                                  const void *router_logits, const int32_t *topk_ids, const float *topk_weights,
                                  void *output, void *workspace, size_t workspace_size, void *stream) {
    const nvfp4moe_io io = {.num_tokens = num_tokens, .hidden = hidden, .router_logits = router_logits,
                            .topk_ids = topk_ids, .topk_weights = topk_weights, .output = output,
                            .workspace = workspace, .workspace_size = workspace_size};
    return nvfp4moe_plan_forward(plan, &io, stream);
}

void nvfp4moe_plan_destroy(nvfp4moe_plan *plan) {
    if (!nvfp4moe_handle_remove(plan, NVFP4MOE_HANDLE_PLAN)) return;   // NULL, destroyed already, or not a plan
    if (plan->impl && plan->state) plan->impl->destroy(plan->state);
    free(plan);
}
