/*
 * oracle.h - what the rest of the library reads of the oracle besides the public nvfp4moe_select:
 * the backend table's implementations. Not installed.
 */
#ifndef NVFP4MOE_ORACLE_H
#define NVFP4MOE_ORACLE_H

#include "backends/backends.h"

/* The implementation in this build of the backend table's row called name (compared as
 * nvfp4moe_name_eq does, so "marlin" finds MARLIN); NULL when the row has none or there is no
 * such row. */
const nvfp4moe_backend_impl *nvfp4moe_backend_impl_find(const char *name);

/* The backend table's row names in table order, i in [0, nvfp4moe_backend_count()): what a test
 * walks to cover every backend. */
int nvfp4moe_backend_count(void);
const char *nvfp4moe_backend_name(int i);

#endif // NVFP4MOE_ORACLE_H
