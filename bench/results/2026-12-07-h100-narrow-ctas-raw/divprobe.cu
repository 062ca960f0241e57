// div.full.f32 (Triton's '/', the EMULATION kernels' triton_div) against IEEE division for the
// input QDQ's dequant step s / gs of gpu_test's failing EMULATION case (gs = 0x1.323e34p+9) over
// every positive E4M3 scale value s.
#include <cstdio>
#include <cmath>
__global__ void k(const float *a, float b, float *full, float *rn, int n) {
    int i = threadIdx.x + blockIdx.x * blockDim.x;
    if (i >= n) return;
    float r;
    asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a[i]), "f"(b));
    full[i] = r;
    rn[i] = __fdiv_rn(a[i], b);
}
static float e4m3(int c) {
    int e = (c >> 3) & 15, m = c & 7;
    return e ? std::ldexp(1.0f + m / 8.0f, e - 7) : std::ldexp(m / 8.0f, -6);
}
int main() {
    const int n = 126;  // codes 1..126 (positive, finite)
    float h[n], *da, *df, *dr, f[n], r[n];
    for (int i = 0; i < n; i++) h[i] = e4m3(i + 1);
    cudaMalloc(&da, sizeof h); cudaMalloc(&df, sizeof h); cudaMalloc(&dr, sizeof h);
    cudaMemcpy(da, h, sizeof h, cudaMemcpyHostToDevice);
    const float gs = 0x1.323e34p+9f;
    k<<<1, 128>>>(da, gs, df, dr, n);
    cudaMemcpy(f, df, sizeof h, cudaMemcpyDeviceToHost);
    cudaMemcpy(r, dr, sizeof h, cudaMemcpyDeviceToHost);
    int diff = 0;
    for (int i = 0; i < n; i++) {
        float host = h[i] / gs;
        if (f[i] != host || r[i] != host) {
            diff++;
            printf("s=%a div.full=%a rn=%a host=%a\n", h[i], f[i], r[i], host);
        }
    }
    printf("divprobe: gs=%a, %d of %d E4M3 scales differ (div.full.f32 or __fdiv_rn vs host IEEE)\n", gs, diff, n);
    return 0;
}
