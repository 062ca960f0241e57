/*
 * table.h - the backend table and what its rows are made of; private to src/oracle/.
 *
 * One row per NvFp4MoeBackend value holds everything about that backend: its names, its place in
 * the auto list and the rule that may move it, the vLLM experts classes it tries with their
 * trait predicates (each failing predicate says why), and its implementation in this build or
 * why there is none. The selection (select.c) and the plans (through nvfp4moe_backend_impl_find)
 * read the same row. How to add a backend: docs/architecture.md.
 */
#ifndef NVFP4MOE_ORACLE_TABLE_H
#define NVFP4MOE_ORACLE_TABLE_H

#include "oracle/oracle.h"

/* The vLLM revision mirrored: the seed's oracle/nvfp4.py (NvFp4MoEKernelOracle, with
 * FLASHINFER_MOE_EP_CUTEDSL and prioritize_humming) and the kernel classes of the same vLLM main
 * (docs/select.md lists the files). Where the seed and that revision differ, the seed wins. */
#define NVFP4MOE_VLLM_REVISION "vLLM main of October 2026 (oracle/nvfp4.py with NvFp4MoEKernelOracle)"

// ---- the facts a predicate reads ----

/* One deployment as vLLM's FusedMoEConfig sees it, derived once per selection. */
typedef struct oracle_ctx {
    const nvfp4moe_config *cfg;
    const nvfp4moe_device *dev;
    nvfp4moe_scheme scheme; /* cfg->scheme, or W4A16 once the B12X force-a16 override dropped the
                               activation key */
    bool use_ep;            /* ep_size > 1 */
    bool use_all2all;       /* use_all2all_kernels: use_ep and dp_size > 1 */
    bool batched;           /* activation format BatchedExperts: DeepEP low-latency or NIXL EP */
    char dev_str[16];       /* "sm_90" / "cpu": our name for the device, for details */
} oracle_ctx;

// ---- kernel traits: what one experts class answers to is_supported_config ----

/* Optional callbacks may be NULL (NULL = vLLM's default for that step). The checks run in vLLM's
 * order and stop at the first failure (select.c, kernel_supported): the class's own gates (pre),
 * then FusedMoEExperts.is_supported_config's base checks, then the class's checks after them
 * (extra). A callback that says no writes vLLM's full reason. */
typedef struct kernel_def {
    const char *name;                                /* the class name: "MarlinExperts" */
    /* (optional) checks the class's is_supported_config makes before the base ones. */
    bool (*pre)(const oracle_ctx *c, char *reason, size_t len);
    /* _supports_current_device: a predicate, or (device NULL) a CUDA GPU with sm_min <= sm and
     * (sm_max 0 or sm <= sm_max), so a new table line needs no new function. */
    bool (*device)(const nvfp4moe_device *dev);
    int32_t sm_min, sm_max;
    /* _supports_current_device also imports the row's library (FlashInfer, b12x): without it vLLM
     * says "current device". Otherwise a missing library is checked last, in our words. */
    bool lib_in_device_check;
    bool no_act_and_mul;                             /* _supports_no_act_and_mul */
    uint32_t activations;                            /* _supports_activation: ACT() bits */
    uint32_t schemes;                                /* _supports_quant_scheme: SCH() bits */
    /* (optional) a further quant rule with its own full reason (e.g. FI-CUTLASS needs sm_100+ for
     * NVFP4 W4A4); returns false after writing the reason. */
    bool (*quant_rule)(const oracle_ctx *c, char *reason, size_t len);
    bool (*parallel)(const oracle_ctx *c);           /* (optional) _supports_parallel_config */
    bool monolithic;                                 /* routes inside the kernel: checks routing */
    uint32_t routings;                               /* monolithic: ROUTE() bits */
    uint32_t logits_dtypes;                          /* monolithic: DT() bits */
    bool batched;                                    /* activation_format() is BatchedExperts */
    bool batch_invariant;                            /* _supports_batch_invariance */
    bool lora;                                       /* supports_lora */
    /* (optional) class-specific checks after the base ones, with their full reason. */
    bool (*extra)(const oracle_ctx *c, char *reason, size_t len);
} kernel_def;

// ---- rank rules: a row that moves next to another in the auto list ----

typedef enum rank_move {
    RANK_KEEP,    /* stay where auto_rank put it */
    RANK_BEFORE,  /* if behind the anchor, go just before it */
    RANK_AFTER,   /* if ahead of the anchor, go just behind it */
} rank_move;

typedef struct rank_rule {
    const char *anchor;  /* the row name it moves next to: "MARLIN" */
    /* The move for this deployment. why (may be left empty): the detail the row's supported,
     * lower-priority kernels show when the rule demoted it. */
    rank_move (*move)(const oracle_ctx *c, char *why, size_t len);
} rank_rule;

// ---- the rows ----

#define MAX_KERNELS 4
#define MAX_BACKENDS 32   /* table.c checks that the table fits */

typedef struct backend_def {
    const char *name;          /* NvFp4MoeBackend value: "MARLIN" */
    const char *moe_backend;   /* the user's name; NULL: reached only by a rewrite (CUTEDSL_BATCHED) */
    int auto_rank;             /* place in the auto list, lowest first; 0: explicit-only */
    bool clamp;                /* in NVFP4_BACKENDS_WITH_CLAMP: applies the SwiGLU clamp */
    bool ours;                 /* not one of vLLM's: hidden under vllm_only */
    uint32_t lib;              /* NVFP4MOE_LIB_* holding vLLM's implementation; 0: none needed */
    const kernel_def *kernels[MAX_KERNELS]; /* in vLLM's order, the first supported one wins */
    const rank_rule *rank;     /* (optional) moves the row after the sort by auto_rank */
    const char *batched_as;    /* (optional) an explicit request becomes this row under the
                                  BatchedExperts format */
    bool a16_when_forced;      /* an explicit request with force_a16 drops the activation key */
    /* The implementation in this build; NULL: not_built says why ("CPU-only build"), or, with
     * lib set, that library is not part of this build. */
    const nvfp4moe_backend_impl *impl;
    const char *not_built;
    /* A CUDA implementation of ours that this CPU-only build lacks: the compute capabilities a
     * CUDA build's kernels run on (the impl's sm_min, sm_max), so a what-if device is planned as
     * a CUDA build would run it. 0: none. */
    int32_t planned_sm_min, planned_sm_max;
} backend_def;

extern const backend_def nvfp4moe_backend_rows[];
extern const int nvfp4moe_backend_row_count;

/* The row called name (exact, upper case as in the table); NULL when none. */
const backend_def *nvfp4moe_backend_row(const char *name);

/* The libraries of vLLM's backends that this build does not contain. */
typedef struct lib_def {
    const char *cli;   /* --installed name */
    const char *what;  /* how a reason names it */
    uint32_t bit;
} lib_def;

extern const lib_def nvfp4moe_oracle_libs[];
extern const int nvfp4moe_oracle_lib_count;

// ---- vLLM's words (words.c) ----
//
// How vLLM's f-strings print the values its reasons and messages format, at the revision
// nvfp4moe_vllm_revision() names.

/* current_platform.device_name: "cuda" on a CUDA GPU, "cpu" on the CPU platform. */
const char *nvfp4moe_platform_device_name(const nvfp4moe_device *dev);
/* str(MoEActivation.X): "MoEActivation.SILU_NO_MUL". */
void nvfp4moe_activation_enum_str(nvfp4moe_activation a, char *buf, size_t len);
/* RoutingMethodType is an IntEnum: f"{m}" prints its value, "1" for Renormalize. */
int nvfp4moe_routing_type_value(nvfp4moe_routing r);
/* Its member name, for details: "RoutingMethodType.Renormalize". */
const char *nvfp4moe_routing_type_name(nvfp4moe_routing r);
/* "torch.bfloat16" ... */
const char *nvfp4moe_torch_dtype_name(nvfp4moe_dtype d);
/* f"{weight_key}x{activation_key}" with QuantKey.__str__: "QuantKey(u8,scale(...),...)xNone". */
void nvfp4moe_quant_scheme_str(nvfp4moe_scheme s, char *buf, size_t len);
/* The FusedMoEParallelConfig dataclass's repr, all 12 fields, as vLLM builds it for rank ep_rank. */
void nvfp4moe_parallel_str(const oracle_ctx *c, char *buf, size_t len);
/* FusedMoEActivationFormat's value: "('standard',)" / "('batched_experts',)". */
const char *nvfp4moe_activation_format_str(bool batched);
/* Python's repr(float) of a double, and repr(str) of an ASCII name. */
void nvfp4moe_py_float_repr(double x, char *out, size_t len);
void nvfp4moe_py_str_repr(const char *s, char *out, size_t len);

/* A bounded string builder: never overflows, remembers the length the full text needs. */
typedef struct sbuf {
    char *buf;
    size_t len, need;
} sbuf;

void nvfp4moe_sb_printf(sbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif // NVFP4MOE_ORACLE_TABLE_H
