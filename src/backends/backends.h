/*
 * backends.h - what a runnable backend provides (src/backends/, one file per backend). The backend
 * table (src/oracle/table.c) points each row at one of these, or says why this build has none;
 * plans call them. Not installed.
 */
#ifndef NVFP4MOE_BACKENDS_H
#define NVFP4MOE_BACKENDS_H

#include "core/internal.h"

#include <stdio.h>

/* The compute capabilities the CUDA backends' kernels are built for (the Makefile's CUDA_GENCODE:
 * sm_80 for mma.sync and cp.async, which run on every newer GPU; sm_90a for wgmma and setmaxnreg,
 * which exist on sm_90 alone). The oracle, the backends and the GPU tests read these. */
#define NVFP4MOE_SM_AMPERE_KERNELS 80
#define NVFP4MOE_SM_HOPPER_KERNELS 90

typedef struct nvfp4moe_backend_impl {
    bool device_memory;        /* forward() takes device pointers and a cudaStream_t */
    /* CUDA backends: the compute capabilities its kernels run on, sm_min <= sm and (sm_max 0 or
     * sm <= sm_max); 0, 0 for host backends, which run anywhere. */
    int32_t sm_min, sm_max;
    /* Numerics the backend computes with for a config of scheme s (MARLIN: always W4A16). */
    nvfp4moe_scheme (*effective_scheme)(nvfp4moe_scheme s);
    /* Prepares the weights (copies / converts them; w may be freed afterwards). opt is the plan's
     * options, never NULL (weights_on_device, num_threads). */
    nvfp4moe_status (*create)(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                              const nvfp4moe_plan_options *opt, const nvfp4moe_device *dev, void **state);
    size_t (*workspace_size)(const void *state, int64_t num_tokens);
    nvfp4moe_status (*forward)(void *state, const nvfp4moe_io *io, void *stream);
    void (*destroy)(void *state);
} nvfp4moe_backend_impl;

/* Whether impl runs on a GPU of compute capability sm; when not, writes why ("this build's
 * kernels need sm_80 or newer (device is sm_75)"). */
static inline bool nvfp4moe_impl_runs_on_sm(const nvfp4moe_backend_impl *impl, int32_t sm, char *why, size_t len) {
    if (impl->sm_min == 0 || (sm >= impl->sm_min && (impl->sm_max == 0 || sm <= impl->sm_max))) return true;
    if (impl->sm_max == impl->sm_min)
        snprintf(why, len, "its kernel is built for sm_%d only (device is sm_%d)", (int)impl->sm_min, (int)sm);
    else
        snprintf(why, len, "this build's kernels need sm_%d or newer (device is sm_%d)", (int)impl->sm_min, (int)sm);
    return false;
}

/* The state impl->create made for plan, when plan is a live plan of that backend; else NULL (the
 * CPU benchmark reaches CPU_FAST's settings through it). src/plan/plan.c. */
void *nvfp4moe_plan_backend_state(const nvfp4moe_plan *plan, const nvfp4moe_backend_impl *impl);

/* src/backends/cpu_reference.c, cpu_fast.c */
extern const nvfp4moe_backend_impl nvfp4moe_impl_cpu_reference;
extern const nvfp4moe_backend_impl nvfp4moe_impl_cpu_fast;
#ifdef NVFP4MOE_HAVE_CUDA
/* src/backends/cuda.c */
extern const nvfp4moe_backend_impl nvfp4moe_impl_marlin;
extern const nvfp4moe_backend_impl nvfp4moe_impl_hopper_wgmma;
extern const nvfp4moe_backend_impl nvfp4moe_impl_emulation;
#endif

#endif // NVFP4MOE_BACKENDS_H
