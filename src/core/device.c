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

nvfp4moe_status nvfp4moe_device_detect_cuda(int32_t ordinal, nvfp4moe_device *dev) {
    NVFP4MOE_RETURN_IF(!dev, NVFP4MOE_ERR_INVALID_ARGUMENT, "device_detect_cuda: dev is NULL");
    char what[24] = "cuda";
    if (ordinal >= 0) snprintf(what, sizeof what, "cuda:%d", (int)ordinal);
#ifdef NVFP4MOE_HAVE_CUDA
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
        (void)cudaGetLastError();
        return nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED, "device %s: no CUDA GPU is visible to this process", what);
    }
    if (ordinal < 0 && cudaGetDevice(&ordinal) != cudaSuccess) {
        (void)cudaGetLastError();
        ordinal = 0;
    }
    NVFP4MOE_RETURN_IF(ordinal >= count, NVFP4MOE_ERR_NOT_FOUND, "device cuda:%d: this process sees %d CUDA device%s",
                       (int)ordinal, count, count == 1 ? "" : "s");
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, ordinal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return nvfp4moe_set_error(NVFP4MOE_ERR_CUDA, "device cuda:%d: cudaGetDeviceProperties: %s", (int)ordinal,
                                  cudaGetErrorString(e));
    }
    memset(dev, 0, sizeof *dev);
    dev->is_cuda = true;
    dev->sm = prop.major * 10 + prop.minor;
    dev->sm_count = prop.multiProcessorCount;
    dev->ordinal = ordinal;
    dev->detected = true;
    nvfp4moe_strlcpy(dev->name, prop.name, sizeof dev->name);
    return NVFP4MOE_OK;
#else
    return nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED, "device %s: this build of nvfp4moe has no CUDA backends "
                              "(built without nvcc)", what);
#endif
}

// ---- names ----

/* Product names vLLM users deploy NVFP4 MoE on, with their compute capability (0 = the CPU).
 * Several names per architecture on purpose: users think in products, the oracle in sm. Matched
 * as nvidia-smi and torch.cuda.get_device_name print them too ("NVIDIA H100 80GB HBM3",
 * "NVIDIA GeForce RTX 4090"): see match_product. */
static const struct {
    const char *name;
    int32_t sm;
} k_device_names[] = {
    {"a100", 80},   {"a800", 80},     {"a30", 80},       {"a10", 86},        {"a10g", 86},
    {"a40", 86},    {"rtx3090", 86},  {"l4", 89},        {"l40", 89},        {"l40s", 89},
    {"rtx4090", 89}, {"h100", 90},    {"h200", 90},      {"h20", 90},        {"h800", 90},
    {"gh200", 90},  {"b100", 100},    {"b200", 100},     {"gb200", 100},     {"b300", 103},
    {"gb300", 103}, {"rtx5090", 120}, {"rtx-pro-6000", 120}, {"dgx-spark", 121}, {"gb10", 121},
    {"cpu", 0},
};

/* The compute capabilities NVIDIA has shipped (CUDA's sm_XY targets): a name outside this list is
 * a typo, not a GPU. */
static const int32_t k_known_sm[] = {50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121};

static bool known_sm(int32_t sm) {
    for (size_t i = 0; i < sizeof k_known_sm / sizeof k_known_sm[0]; i++)
        if (k_known_sm[i] == sm) return true;
    return false;
}

/* "sm_90", "sm90", "SM_100", "sm_90a" (the arch-specific suffixes a/f name the same device):
 * two or three digits, the first non-zero. Returns the capability, -1 when s is not of that
 * form. */
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

/* "9.0", "10.3": torch.cuda.get_device_capability() as major.minor. -1 when not that form. */
static int32_t parse_capability(const char *s) {
    int i = 0, major = 0, minor = 0;
    while (isdigit((unsigned char)s[i]) && i < 2) major = major * 10 + (s[i++] - '0');
    if (i == 0 || s[0] == '0' || s[i] != '.' || !isdigit((unsigned char)s[i + 1]) || s[i + 2]) return -1;
    minor = s[i + 1] - '0';
    return major * 10 + minor;
}

/* The product-name keys of s: its words (split at spaces, '-' and '_'), lower case, without a
 * leading "nvidia", "geforce" or "tesla"; keys[k - 1] is its first k words run together (k = 1 ..
 * the count returned, at most max_words), each at most len bytes. */
static int product_keys(const char *s, char keys[][32], int max_words, size_t len) {
    int words = 0;
    char acc[32] = "";
    while (*s && words < max_words) {
        while (*s == ' ' || *s == '-' || *s == '_') s++;
        if (!*s) break;
        char w[32];
        size_t n = 0;
        for (; *s && *s != ' ' && *s != '-' && *s != '_'; s++)
            if (n + 1 < sizeof w) w[n++] = (char)tolower((unsigned char)*s);
        w[n] = '\0';
        if (!words && !acc[0] && (!strcmp(w, "nvidia") || !strcmp(w, "geforce") || !strcmp(w, "tesla"))) continue;
        if (strlen(acc) + n + 1 > sizeof acc) break;
        strcat(acc, w);
        nvfp4moe_strlcpy(keys[words++], acc, len);
    }
    return words;
}

/* The table row a product name names: its first words, longest match first, compared without
 * separators ("RTX PRO 6000 Blackwell" is rtx-pro-6000, "A100-SXM4-80GB" is a100). -1: none. */
static int match_product(const char *s) {
    char keys[8][32];
    int words = product_keys(s, keys, 8, sizeof keys[0]);
    for (int k = words; k >= 1; k--) {
        for (size_t i = 0; i < sizeof k_device_names / sizeof k_device_names[0]; i++) {
            char key[32];
            size_t n = 0;
            for (const char *p = k_device_names[i].name; *p && n + 1 < sizeof key; p++)
                if (*p != '-') key[n++] = *p;
            key[n] = '\0';
            if (!strcmp(keys[k - 1], key)) return (int)i;
        }
    }
    return -1;
}

nvfp4moe_status nvfp4moe_device_parse(const char *s, nvfp4moe_device *dev) {
    NVFP4MOE_RETURN_IF(!dev, NVFP4MOE_ERR_INVALID_ARGUMENT, "device_parse: dev is NULL");
    NVFP4MOE_RETURN_IF(!s, NVFP4MOE_ERR_INVALID_ARGUMENT, "device_parse: name is NULL");
    int32_t sm = parse_sm(s);
    if (sm < 0) sm = parse_capability(s);
    const char *canonical = NULL;
    char sm_name[16];
    if (sm >= 0) {
        if (!known_sm(sm)) {
            char list[160] = "";
            size_t used = 0;
            for (size_t i = 0; i < sizeof k_known_sm / sizeof k_known_sm[0] && used < sizeof list; i++)
                used += (size_t)snprintf(list + used, sizeof list - used, ", sm_%d", (int)k_known_sm[i]);
            return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND, "unknown compute capability sm_%d in '%s' (the "
                                      "known ones: %s)", (int)sm, s, list + 2);
        }
        snprintf(sm_name, sizeof sm_name, "sm_%d", (int)sm);
        canonical = sm_name;
    } else {
        int row = match_product(s);
        if (row >= 0) {
            sm = k_device_names[row].sm;
            canonical = k_device_names[row].name;
        }
    }
    if (!canonical) {
        char list[400] = "";
        size_t used = 0;
        nvfp4moe_suggest sg;
        nvfp4moe_suggest_init(&sg, s);
        for (size_t i = 0; i < sizeof k_device_names / sizeof k_device_names[0]; i++) {
            nvfp4moe_suggest_add(&sg, k_device_names[i].name);
            if (used < sizeof list)
                used += (size_t)snprintf(list + used, sizeof list - used, ", %s", k_device_names[i].name);
        }
        const char *best = nvfp4moe_suggest_best(&sg);
        return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND,
                                  "unknown device '%s' (expected sm_XY such as sm_90 or sm_100, a "
                                  "capability such as 9.0, or one of: %s)%s%s%s", s, list + 2,
                                  best ? "; did you mean '" : "", best ? best : "", best ? "'?" : "");
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
