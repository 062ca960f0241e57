/*
 * device.c - the device the oracle plans for: detected at run time (the first CUDA GPU, else the
 * CPU) or given by the user as sm_XY / a product name, for what-if planning on any machine.
 */
#include "core/internal.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#ifdef NVFP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

// ---- detection ----

static void device_cpu(nvfp4moe_device *dev) {
    memset(dev, 0, sizeof *dev);
    dev->is_cuda = false;
    dev->sm = 0;
    dev->ordinal = -1;
    dev->detected = true;
    nvfp4moe_strlcpy(dev->name, "cpu", sizeof dev->name);
}

nvfp4moe_status nvfp4moe_device_detect(nvfp4moe_device *dev) {
    NVFP4MOE_RETURN_IF(!dev, NVFP4MOE_ERR_INVALID_ARGUMENT, "device_detect: dev is NULL");
    device_cpu(dev);
#ifdef NVFP4MOE_HAVE_CUDA
    /* A CUDA build often runs where there is no driver or no GPU (CI, a laptop): every failure of
     * the runtime here simply means "plan for the CPU", never an error. */
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
        (void)cudaGetLastError(); /* clear the sticky error so later CUDA calls start clean */
        return NVFP4MOE_OK;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return NVFP4MOE_OK;
    }
    dev->is_cuda = true;
    dev->sm = prop.major * 10 + prop.minor;
    dev->sm_count = prop.multiProcessorCount;
    dev->ordinal = 0;
    dev->detected = true;
    nvfp4moe_strlcpy(dev->name, prop.name, sizeof dev->name);
#endif
    return NVFP4MOE_OK;
}

// ---- names ----

/* Product names vLLM users deploy NVFP4 MoE on, with their compute capability (0 = the CPU).
 * Several names per architecture on purpose: users think in products, the oracle in sm. */
static const struct {
    const char *name;
    int32_t sm;
} k_device_names[] = {
    {"a100", 80},   {"l40s", 89},    {"h100", 90},         {"h200", 90},
    {"b200", 100},  {"gb200", 100},  {"b300", 103},        {"rtx5090", 120},
    {"rtx-pro-6000", 120},           {"dgx-spark", 121},   {"cpu", 0},
};


/* "sm_90", "sm90", "SM_100", "sm_90a" (the arch-specific suffixes a/f name the same device):
 * two or three digits, the first non-zero. Returns the capability or -1. */
static int32_t parse_sm(const char *s) {
    if (tolower((unsigned char)s[0]) != 's' || tolower((unsigned char)s[1]) != 'm') return -1;
    s += 2;
    if (*s == '_' || *s == '-') s++;
    int digits = 0;
    int32_t v = 0;
    while (isdigit((unsigned char)s[digits]) && digits < 4) {
        v = v * 10 + (s[digits] - '0');
        digits++;
    }
    if (digits < 2 || digits > 3 || s[0] == '0') return -1;
    const char *rest = s + digits;
    if (*rest == 'a' || *rest == 'A' || *rest == 'f' || *rest == 'F') rest++;
    return *rest ? -1 : v;
}

nvfp4moe_status nvfp4moe_device_parse(const char *s, nvfp4moe_device *dev) {
    NVFP4MOE_RETURN_IF(!dev, NVFP4MOE_ERR_INVALID_ARGUMENT, "device_parse: dev is NULL");
    NVFP4MOE_RETURN_IF(!s, NVFP4MOE_ERR_INVALID_ARGUMENT, "device_parse: name is NULL");
    int32_t sm = parse_sm(s);
    const char *canonical = NULL;
    char sm_name[16];
    if (sm >= 0) {
        snprintf(sm_name, sizeof sm_name, "sm_%d", (int)sm);
        canonical = sm_name;
    } else {
        for (size_t i = 0; i < sizeof k_device_names / sizeof k_device_names[0]; i++) {
            if (nvfp4moe_name_eq(s, k_device_names[i].name)) {
                sm = k_device_names[i].sm;
                canonical = k_device_names[i].name;
                break;
            }
        }
    }
    if (!canonical) {
        char list[256] = "";
        size_t used = 0;
        for (size_t i = 0; i < sizeof k_device_names / sizeof k_device_names[0] && used < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, ", %s", k_device_names[i].name);
        return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND,
                                  "unknown device '%s' (expected sm_XY such as sm_90 or sm_100, or one "
                                  "of: %s)", s, list + 2);
    }
    memset(dev, 0, sizeof *dev);
    dev->is_cuda = sm != 0;
    dev->sm = sm;
    dev->sm_count = 0;
    dev->ordinal = -1;
    dev->detected = false;
    nvfp4moe_strlcpy(dev->name, canonical, sizeof dev->name);
    return NVFP4MOE_OK;
}

const char *nvfp4moe_device_str(const nvfp4moe_device *dev, char *buf, size_t len) {
    if (!buf || len == 0) return "";
    if (!dev || !dev->is_cuda)
        nvfp4moe_strlcpy(buf, "cpu", len);
    else
        snprintf(buf, len, "sm_%d", (int)dev->sm);
    return buf;
}
