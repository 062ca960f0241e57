// pdl.cuh - programmatic dependent launch (sm_90+), the device side.
//
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start before the
// kernel ahead of it in the stream has finished: as soon as every CTA of that kernel has run
// trigger() (or exited). It must then call wait() before it reads anything the kernel ahead
// wrote, or writes anything that kernel still reads: griddepcontrol.wait returns once the grids
// it depends on have completed and their memory operations are visible to it. What a kernel
// does before wait() -- its launch, its prologue, loads of data that no earlier kernel of the
// forward writes -- overlaps the kernel ahead. trigger() itself orders no memory.
//
// Both are no-ops where they do not apply: wait() in a kernel launched without the attribute
// (the stream order already holds), trigger() when the next kernel was launched without it, and
// both on devices before sm_90 (compiled out).
#ifndef NVFP4MOE_PDL_CUH
#define NVFP4MOE_PDL_CUH

#include <cuda_runtime.h>

namespace nvfp4moe_pdl {

// The host side: the configuration of a launch (cudaLaunchKernelEx) that is a programmatic
// dependent of the kernel ahead when pdl is set. attr: the storage of its one attribute, which
// must outlive the launch call.
inline cudaLaunchConfig_t config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                                 cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cfg;
}

__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace nvfp4moe_pdl

#endif  // NVFP4MOE_PDL_CUH
