/*
 * plan.c - plans: the oracle's choice, prepared for one layer's weights; and the CPU_REFERENCE
 * backend, the reference layer wrapped as a runnable backend (always present, always last).
 */
#include "core/internal.h"

#include <stdlib.h>
#include <string.h>

// ---- runnable backends ----
//
// To add one: write src/backends/<name>.c defining a `const nvfp4moe_backend_impl`, declare it in
// internal.h, add it below, and give the oracle table (src/oracle/oracle.c) its row.

static const nvfp4moe_backend_impl *const k_impls[] = {
#ifdef NVFP4MOE_HAVE_CUDA
    &nvfp4moe_impl_marlin,      /* src/backends/cuda.c */
    &nvfp4moe_impl_hopper_wgmma,
    &nvfp4moe_impl_emulation,
#endif
    &nvfp4moe_impl_cpu_fast,
    &nvfp4moe_impl_cpu_reference,
};

const nvfp4moe_backend_impl *nvfp4moe_impl_find(const char *backend_name) {
    if (!backend_name) return NULL;
    for (size_t i = 0; i < sizeof k_impls / sizeof k_impls[0]; i++)
        if (!strcmp(k_impls[i]->name, backend_name)) return k_impls[i];
    return NULL;
}

// ---- CPU_REFERENCE ----

static nvfp4moe_scheme same_scheme(nvfp4moe_scheme s) { return s; }

static nvfp4moe_status cpu_ref_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                      bool weights_on_device, const nvfp4moe_device *dev, void **state) {
    NVFP4MOE_RETURN_IF(weights_on_device, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "backend CPU_REFERENCE runs on the host but the weights are in device memory");
    nvfp4moe_layer *copy;
    NVFP4MOE_TRY(nvfp4moe_layer_copy(cfg, w, &copy));
    *state = copy;
    return NVFP4MOE_OK;
}

static size_t cpu_ref_workspace(const void *state, int64_t num_tokens) { return 0; }

static nvfp4moe_status cpu_ref_forward(void *state, const nvfp4moe_io *io, void *stream) {
    const nvfp4moe_layer *l = state;
    return nvfp4moe_reference_forward(&l->cfg, &l->w, io);
}

static void cpu_ref_destroy(void *state) { nvfp4moe_layer_free(state); }

const nvfp4moe_backend_impl nvfp4moe_impl_cpu_reference = {
    .name = "CPU_REFERENCE",
    .device_memory = false,
    .effective_scheme = same_scheme,
    .create = cpu_ref_create,
    .workspace_size = cpu_ref_workspace,
    .forward = cpu_ref_forward,
    .destroy = cpu_ref_destroy,
};

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

    nvfp4moe_plan *plan = calloc(1, sizeof *plan);
    NVFP4MOE_RETURN_IF(!plan, NVFP4MOE_ERR_OUT_OF_MEMORY, "nvfp4moe_plan_create: out of memory");
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
        plan->impl = nvfp4moe_impl_find(plan->report.backend);
        if (!plan->impl)
            st = nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED,
                                    "the oracle chose %s, but this build cannot run it (no implementation compiled in)",
                                    plan->report.backend);
    }
    if (st == NVFP4MOE_OK && !o.weights_on_device) st = nvfp4moe_weights_validate(&plan->cfg, w);
    if (st == NVFP4MOE_OK) st = plan->impl->create(&plan->cfg, w, o.weights_on_device, &dev, &plan->state);
    if (st != NVFP4MOE_OK) {
        free(plan);
        return st;
    }
    *out = plan;
    return NVFP4MOE_OK;
}

const char *nvfp4moe_plan_backend(const nvfp4moe_plan *plan) { return plan ? plan->report.backend : ""; }
const char *nvfp4moe_plan_kernel(const nvfp4moe_plan *plan) { return plan ? plan->report.kernel : ""; }
const nvfp4moe_report *nvfp4moe_plan_report(const nvfp4moe_plan *plan) { return plan ? &plan->report : NULL; }
bool nvfp4moe_plan_uses_device_memory(const nvfp4moe_plan *plan) { return plan && plan->impl->device_memory; }

nvfp4moe_scheme nvfp4moe_plan_effective_scheme(const nvfp4moe_plan *plan) {
    return plan->impl->effective_scheme(plan->cfg.scheme);
}

size_t nvfp4moe_plan_workspace_size(const nvfp4moe_plan *plan, int64_t num_tokens) {
    if (!plan || num_tokens < 0) return 0;
    return plan->impl->workspace_size(plan->state, num_tokens);
}

nvfp4moe_status nvfp4moe_plan_forward(nvfp4moe_plan *plan, const nvfp4moe_io *io, void *stream) {
    NVFP4MOE_RETURN_IF(!plan || !io, NVFP4MOE_ERR_INVALID_ARGUMENT, "nvfp4moe_plan_forward: %s is NULL",
                       !plan ? "plan" : "io");
    NVFP4MOE_RETURN_IF(io->num_tokens < 0, NVFP4MOE_ERR_SHAPE, "io.num_tokens=%lld is negative",
                       (long long)io->num_tokens);
    size_t need = plan->impl->workspace_size(plan->state, io->num_tokens);
    NVFP4MOE_RETURN_IF(need > 0 && (!io->workspace || io->workspace_size < need), NVFP4MOE_ERR_BUFFER_TOO_SMALL,
                       "io.workspace: %zu bytes given, %zu needed for %lld tokens on %s",
                       io->workspace ? io->workspace_size : (size_t)0, need, (long long)io->num_tokens,
                       plan->report.backend);
    return plan->impl->forward(plan->state, io, stream);
}

void nvfp4moe_plan_destroy(nvfp4moe_plan *plan) {
    if (!plan) return;
    if (plan->impl && plan->state) plan->impl->destroy(plan->state);
    free(plan);
}
