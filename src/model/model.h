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

/* Reads a whole (small) text file: config.json and friends. *out is NUL-terminated, caller frees.
 * NOT_FOUND when it does not exist; files over max_bytes are a FORMAT error. */
nvfp4moe_status nvfp4moe_read_text_file(const char *path, size_t max_bytes, char **out);

/* Writes text to path through path.tmp + rename. */
nvfp4moe_status nvfp4moe_write_text_file(const char *path, const char *text);

#endif // NVFP4MOE_MODEL_H
