/*
 * json_internal.h - what the JSON interface's files share: a deployment read from JSON sources
 * (deploy.c) and the JSON forms of the library's values. Private to src/json/.
 */
#ifndef NVFP4MOE_JSON_INTERNAL_H
#define NVFP4MOE_JSON_INTERNAL_H

#include "core/internal.h"

#include <jansson.h>

/* Keys a source gave, for what a request may leave to the weights (json_deploy.given). */
#define DEPLOY_GIVEN_EXPERTS  (1u << 0)
#define DEPLOY_GIVEN_HIDDEN   (1u << 1)
#define DEPLOY_GIVEN_INTER    (1u << 2)
#define DEPLOY_GIVEN_TOP_K    (1u << 3)
#define DEPLOY_GIVEN_BIAS     (1u << 4)
#define DEPLOY_GIVEN_CORR     (1u << 5)
#define DEPLOY_GIVEN_MODEL    (DEPLOY_GIVEN_EXPERTS | DEPLOY_GIVEN_HIDDEN | DEPLOY_GIVEN_INTER | \
                               DEPLOY_GIVEN_TOP_K | DEPLOY_GIVEN_BIAS | DEPLOY_GIVEN_CORR)

/* A deployment being read: the config so far, which keys were given, and the parallel keys that
 * are resolved once every source is in (enable_expert_parallel depends on the final TP and DP). */
typedef struct json_deploy {
    nvfp4moe_config cfg;
    uint32_t given;
    bool ep_set;        /* an explicit ep_size, from the source that set it last */
    int32_t ep;
    int enable_ep;      /* enable_expert_parallel: -1 not given, 0 false, 1 true */
    bool ep_and_enable; /* the last source to set either set both: they must agree */
    bool out_dtype_given; /* out_dtype was given: in_dtype no longer sets it */
} json_deploy;

/* The defaults (nvfp4moe_config_init), nothing given. */
void json_deploy_init(json_deploy *d);
/* A model config (nvfp4moe_model_info) as the base: its MoE config, every shape key given; its
 * warnings are appended to warnings (a JSON array, may be NULL). */
void json_deploy_model(json_deploy *d, const nvfp4moe_model_info *info, json_t *warnings);
/* Applies the deployment keys of obj (a JSON object; where names it in messages: "deployment").
 * strict: an unknown key is INVALID_ARGUMENT; otherwise it is ignored. */
nvfp4moe_status json_deploy_apply(json_deploy *d, json_t *obj, const char *where, bool strict);
/* Resolves the parallel keys (the config is not validated here). */
nvfp4moe_status json_deploy_finish(json_deploy *d);

/* The config with the canonical keys (nvfp4moe_config's field names, parallel ones flat):
 * json_deploy_apply reads it back to the same config. NULL without memory. */
json_t *json_config_object(const nvfp4moe_config *cfg);
/* The report's object (nvfp4moe_report_json). NULL without memory. */
json_t *json_report_object(const nvfp4moe_report *r);

#endif // NVFP4MOE_JSON_INTERNAL_H
