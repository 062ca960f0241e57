// moe_route.cu - GPU routing grid: router logits [M, E] -> top-k ids and weights, one warp per
// token (the per-token logic is in moe_route.cuh, shared with the fused small-M kernel).
#include "moe_route.cuh"
#include "pdl.cuh"

namespace {

constexpr int kRouteWarps = 4;  // tokens per block; keeps the per-warp score arrays in 32 KB at E=1024

template <int VPL>
__global__ void __launch_bounds__(kRouteWarps * 32)
route_kernel(nvfp4moe_gpu_route_params rp, const void *logits, int64_t M, int32_t *ids,
             float *weights) {
    extern __shared__ double smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    double *sel = smem + (size_t)warp * rp.num_experts;
    nvfp4moe_pdl::trigger();  // the grouping, launched with PDL behind this grid, may start (it waits)
    const int64_t t = (int64_t)blockIdx.x * kRouteWarps + warp;
    if (t >= M) return;  // whole warp leaves together
    nvfp4moe_rt::route_token<VPL>(rp, logits, t, sel, ids, weights, lane);
}

}  // namespace

cudaError_t nvfp4moe_gpu_route_grid(const nvfp4moe_gpu_route_params *rp, const void *logits,
                                    int64_t M, int32_t *ids, float *weights, cudaStream_t stream) {
    if (M <= 0) return cudaSuccess;
    const int64_t blocks = (M + kRouteWarps - 1) / kRouteWarps;
    const size_t smem = (size_t)kRouteWarps * rp->num_experts * sizeof(double);
    switch (nvfp4moe_rt::vpl_for(rp->num_experts)) {
    case 2: route_kernel<2><<<(unsigned)blocks, kRouteWarps * 32, smem, stream>>>(*rp, logits, M, ids, weights); break;
    case 4: route_kernel<4><<<(unsigned)blocks, kRouteWarps * 32, smem, stream>>>(*rp, logits, M, ids, weights); break;
    case 8: route_kernel<8><<<(unsigned)blocks, kRouteWarps * 32, smem, stream>>>(*rp, logits, M, ids, weights); break;
    case 16: route_kernel<16><<<(unsigned)blocks, kRouteWarps * 32, smem, stream>>>(*rp, logits, M, ids, weights); break;
    default: route_kernel<32><<<(unsigned)blocks, kRouteWarps * 32, smem, stream>>>(*rp, logits, M, ids, weights); break;
    }
    return cudaGetLastError();
}
