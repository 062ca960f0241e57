/*
 * cli_outdir.h - an output directory written as one transaction, for `nvfp4moe quantize`: the
 * files go into a temporary directory beside --out, are fsynced, and only then replace --out, so
 * --out ends up holding all the new files or, after any failure, exactly what it held before.
 */
#ifndef NVFP4MOE_CLI_OUTDIR_H
#define NVFP4MOE_CLI_OUTDIR_H

#include <limits.h>
#include <stdbool.h>

typedef struct {
    char final[PATH_MAX];   /* --out, absolute and symlink-free */
    char tmp[PATH_MAX];     /* where the files are written; "" once committed or aborted */
    bool replace;           /* --out exists and is not empty (--force) */
} cli_outdir;

/* Checks --out and makes the temporary directory (o->tmp) to write into. Refused, with a message
 * and -1: --out equal to or inside in (the source; in may be NULL), in inside --out, --out a file,
 * or a non-empty --out without force. Creates --out's missing parent directories. */
int cli_outdir_begin(const char *cmd, const char *out, const char *in, bool force, cli_outdir *o);

/* Puts the written directory in place (fsync, rename or atomic exchange with the old --out, fsync
 * of the parent) and deletes the replaced tree. On failure --out is left as it was, o->tmp is
 * deleted and -1 returned after a message. */
int cli_outdir_commit(const char *cmd, cli_outdir *o);

/* Deletes the temporary directory and everything written into it. */
void cli_outdir_abort(cli_outdir *o);

#endif // NVFP4MOE_CLI_OUTDIR_H
