/*
 * model.h - what the model subsystem's files (src/model/: config.json, checkpoint loading and
 * writing) share. Not installed.
 */
#ifndef NVFP4MOE_MODEL_H
#define NVFP4MOE_MODEL_H

#include "core/internal.h"

/* Appends a formatted warning to w (counted in w->dropped once full). */
void nvfp4moe_warn(nvfp4moe_warnings *w, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* An exclusion pattern compiled for matching module names (module_pattern.c): "re:" + a regular
 * expression matched as Python's re.match, or fnmatch wildcards matched against the whole name.
 * Compiling refuses (FORMAT, naming `where` and the pattern) what the matcher does not read and
 * anything too long or complex; a match costs at most (instructions x name length) steps. */
typedef struct nvfp4moe_pattern nvfp4moe_pattern;
nvfp4moe_status nvfp4moe_pattern_compile(const char *pattern, const char *where, nvfp4moe_pattern **out);
bool nvfp4moe_pattern_match(const nvfp4moe_pattern *p, const char *name);
const char *nvfp4moe_pattern_text(const nvfp4moe_pattern *p);
void nvfp4moe_pattern_free(nvfp4moe_pattern *p);

/* config.json for a model quantized by nvfp4moe (config_write.c): base_config_json (the source's)
 * with its quantization_config replaced by fmt's (ModelOpt as its export writes it, or
 * compressed-tensors), plus hf_quant_config.json for ModelOpt; excluded: the exclude_modules /
 * ignore list. */
nvfp4moe_status nvfp4moe_model_config_write_quantized(const char *dir, const char *base_config_json,
                                                      nvfp4moe_ckpt_format fmt, bool w4a16,
                                                      const char *const *excluded, size_t n_excluded);

#endif // NVFP4MOE_MODEL_H
