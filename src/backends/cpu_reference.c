/*
 * cpu_reference.c - CPU_REFERENCE: the float64 reference layer (src/reference/moe_ref.c) as a
 * runnable backend. It runs everywhere and supports every config, so something always runs.
 */
#include "backends/backends.h"

static nvfp4moe_scheme same_scheme(nvfp4moe_scheme s) { return s; }

static nvfp4moe_status cpu_ref_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                      const nvfp4moe_plan_options *opt, const nvfp4moe_device *dev, void **state) {
    NVFP4MOE_RETURN_IF(opt->weights_on_device, NVFP4MOE_ERR_INVALID_ARGUMENT,
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
    .device_memory = false,
    .effective_scheme = same_scheme,
    .create = cpu_ref_create,
    .workspace_size = cpu_ref_workspace,
    .forward = cpu_ref_forward,
    .destroy = cpu_ref_destroy,
};
