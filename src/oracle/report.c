/*
 * report.c - the oracle's report as text: the verdict names and nvfp4moe_report_render.
 */
#include "oracle/table.h"

const char *nvfp4moe_verdict_name(nvfp4moe_verdict v) {
    switch (v) {
    case NVFP4MOE_VERDICT_CHOSEN:      return "chosen";
    case NVFP4MOE_VERDICT_SUPPORTED:   return "supported";
    case NVFP4MOE_VERDICT_REJECTED:    return "rejected";
    case NVFP4MOE_VERDICT_NOT_IN_LIST: return "not in list";
    }
    return "?";
}
// ---- rendering ----

static const char *verdict_label(nvfp4moe_verdict v) {
    switch (v) {
    case NVFP4MOE_VERDICT_CHOSEN:      return "chosen";
    case NVFP4MOE_VERDICT_SUPPORTED:   return "supported, lower priority";
    case NVFP4MOE_VERDICT_REJECTED:    return "rejected";
    case NVFP4MOE_VERDICT_NOT_IN_LIST: return "not in the list";
    }
    return "?";
}

size_t nvfp4moe_report_render(const nvfp4moe_report *r, char *buf, size_t len) {
    sbuf b = {buf, buf ? len : 0, 0};
    if (b.len) buf[0] = '\0';
    if (!r) return 0;
    nvfp4moe_sb_printf(&b, "device:   %s\n", r->device[0] ? r->device : "?");
    nvfp4moe_sb_printf(&b, "request:  moe_backend=%s\n", r->requested[0] ? r->requested : "?");
    if (r->backend[0]) {
        nvfp4moe_sb_printf(&b, "backend:  %s\n", r->backend);
        nvfp4moe_sb_printf(&b, "kernel:   %s\n", r->kernel);
    } else {
        nvfp4moe_sb_printf(&b, "backend:  none\n");
    }
    if (r->log[0]) nvfp4moe_sb_printf(&b, "vllm log: %s\n", r->log);
    if (r->error_kind[0]) nvfp4moe_sb_printf(&b, "error:    %s: %s\n", r->error_kind, r->error);
    if (r->detail[0]) nvfp4moe_sb_printf(&b, "note:     %s\n", r->detail);
    if (r->n_candidates > 0) {
        nvfp4moe_sb_printf(&b, "\ncandidates, in priority order:\n");
        nvfp4moe_sb_printf(&b, "  %-27s %-40s %-26s %s\n", "BACKEND", "KERNEL", "VERDICT", "REASON");
        for (int i = 0; i < r->n_candidates; i++) {
            const nvfp4moe_candidate *cd = &r->candidates[i];
            /* vLLM's reason, then ours in brackets: the two never run together. */
            nvfp4moe_sb_printf(&b, "  %-27s %-40s %-26s %s%s%s%s\n", cd->backend, cd->kernel, verdict_label(cd->verdict),
                               cd->reason[0] ? cd->reason : "-", cd->detail[0] ? "  [" : "", cd->detail,
                               cd->detail[0] ? "]" : "");
        }
    }
    return b.need;
}

