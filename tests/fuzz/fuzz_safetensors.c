/*
 * fuzz_safetensors.c - libFuzzer target: the input is a .safetensors file. Opening it must either
 * fail with a status and a message or give tensors whose every byte can be read, through the
 * mapping and through nvfp4moe_st_tensor_read alike (ASan watches both), and which all lie inside
 * the file. `make fuzz` runs it with tests/fuzz/corpus/safetensors and safetensors.dict.
 */
#include "fuzz_util.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fuzz_dir();
    fuzz_write(dir, "model.safetensors", data, size);
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    nvfp4moe_st_file *f = NULL;
    nvfp4moe_status s = nvfp4moe_st_open(path, &f);
    fuzz_check_failure(s);
    if (s != NVFP4MOE_OK) return 0;
    uint64_t end = 0, sum = 0;
    static uint8_t buf[1 << 16];
    for (size_t i = 0; i < nvfp4moe_st_file_count(f); i++) {
        const nvfp4moe_st_tensor *t = nvfp4moe_st_file_tensor(f, i);
        if (t->offset + t->nbytes > size || t->offset + t->nbytes < end) abort();   // inside, in order
        end = t->offset + t->nbytes;
        const uint8_t *p = t->data;
        for (uint64_t b = 0; b < t->nbytes; b++) sum += p[b];
        uint64_t n = t->nbytes < sizeof buf ? t->nbytes : sizeof buf;
        if (nvfp4moe_st_tensor_read(t, t->nbytes - n, n, buf) != NVFP4MOE_OK) abort();
        if (n && memcmp(buf, p + (t->nbytes - n), (size_t)n) != 0) abort();
        if (nvfp4moe_st_file_find(f, t->name) != t) abort();
    }
    (void)nvfp4moe_st_file_metadata(f, "format");
    nvfp4moe_st_close(f);
    // The same bytes as a one-file model directory.
    nvfp4moe_st_model *m = NULL;
    s = nvfp4moe_st_model_open(dir, &m);
    fuzz_check_failure(s);
    nvfp4moe_st_model_close(m);
    return (int)(sum & 0);
}
