/*
 * cli_outdir.c - an output directory written as one transaction (see cli_outdir.h).
 *
 * Everything is written into a fresh directory beside --out (same file system, so the last step
 * is a rename), fsynced, and then put in place: renamed onto a missing or empty --out, or, with
 * --force, atomically exchanged with the old --out (renameat2 RENAME_EXCHANGE; two renames where
 * the file system cannot), after which the old tree is deleted. A failure before that last step
 * deletes the new directory and leaves --out as it was.
 */
#define _GNU_SOURCE   // renameat2, nftw's FTW_PHYS
#include "cli_outdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The absolute, symlink-free form of path, which need not exist: its deepest existing ancestor
 * goes through realpath and the missing rest (which holds no link, since it does not exist) is
 * appended. */
static int resolve(const char *path, char *out, size_t len) {
    char head[PATH_MAX], tail[PATH_MAX] = "";
    if (snprintf(head, sizeof head, "%s", path) >= (int)sizeof head) return -1;
    for (;;) {
        char real[PATH_MAX];
        if (realpath(head[0] ? head : ".", real)) {
            int n = snprintf(out, len, "%s%s%s", real, tail[0] && strcmp(real, "/") ? "/" : "", tail);
            return n < 0 || (size_t)n >= len ? -1 : 0;
        }
        if (errno != ENOENT) return -1;
        char *slash = strrchr(head, '/');
        while (slash && slash > head && slash[1] == '\0') *slash = '\0', slash = strrchr(head, '/');
        const char *name = slash ? slash + 1 : head;
        char t[PATH_MAX];
        if (snprintf(t, sizeof t, "%s%s%s", name, tail[0] ? "/" : "", tail) >= (int)sizeof t) return -1;
        memcpy(tail, t, sizeof tail);
        if (!slash) head[0] = '\0';
        else if (slash == head) head[1] = '\0';
        else *slash = '\0';
        if (!strcmp(name, "..") || !strcmp(name, ".")) return -1;   // keep it simple: refuse
    }
}

/* a is b or lies inside it. */
static bool inside(const char *a, const char *b) {
    size_t n = strlen(b);
    return !strncmp(a, b, n) && (a[n] == '\0' || a[n] == '/' || (n == 1 && b[0] == '/'));
}

static int is_empty_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    return empty;
}

/* mkdir -p of path's parents, and path's parent itself. */
static int make_parents(const char *cmd, const char *path) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "nvfp4moe %s: cannot create %s: %s\n", cmd, p, strerror(errno));
            return -1;
        }
        *s = '/';
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) != 0 ? -1 : 0;
}

/* rm -rf that never follows a symbolic link out of the tree. */
static int remove_tree(const char *path) {
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int sync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int cli_outdir_begin(const char *cmd, const char *out, const char *in, bool force, cli_outdir *o) {
    memset(o, 0, sizeof *o);
    if (resolve(out, o->final, sizeof o->final) != 0) {
        fprintf(stderr, "nvfp4moe %s: --out %s: cannot resolve the path: %s\n", cmd, out, strerror(errno));
        return -1;
    }
    if (in) {
        char src[PATH_MAX];
        if (!realpath(in, src)) {
            fprintf(stderr, "nvfp4moe %s: --in %s: %s\n", cmd, in, strerror(errno));
            return -1;
        }
        if (inside(o->final, src)) {
            fprintf(stderr, "nvfp4moe %s: --out %s is %s --in %s: the source would be overwritten\n", cmd, out,
                    strcmp(o->final, src) ? "inside" : "the same directory as", in);
            return -1;
        }
        if (inside(src, o->final)) {
            fprintf(stderr, "nvfp4moe %s: --in %s is inside --out %s: replacing --out would delete the source\n",
                    cmd, in, out);
            return -1;
        }
    }
    struct stat st;
    if (lstat(o->final, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
            fprintf(stderr, "nvfp4moe %s: --out %s exists and is not a directory\n", cmd, out);
            return -1;
        }
        int empty = is_empty_dir(o->final);
        if (empty < 0) {
            fprintf(stderr, "nvfp4moe %s: --out %s: %s\n", cmd, out, strerror(errno));
            return -1;
        }
        if (!empty && !force) {
            fprintf(stderr, "nvfp4moe %s: --out %s is not empty: files left in it (an older index, other "
                    "shards) would be read with the new ones; use --force to replace it whole\n", cmd, out);
            return -1;
        }
        o->replace = !empty;
    } else if (errno != ENOENT) {
        fprintf(stderr, "nvfp4moe %s: --out %s: %s\n", cmd, out, strerror(errno));
        return -1;
    }
    if (make_parents(cmd, o->final) != 0) return -1;
    const char *slash = strrchr(o->final, '/');
    snprintf(o->tmp, sizeof o->tmp, "%.*s/.%s.nvfp4moe-XXXXXX", (int)(slash - o->final), o->final, slash + 1);
    if (!mkdtemp(o->tmp)) {
        fprintf(stderr, "nvfp4moe %s: cannot create a directory beside %s: %s\n", cmd, out, strerror(errno));
        o->tmp[0] = '\0';
        return -1;
    }
    // mkdtemp makes it 0700; the output gets what mkdir would have given it.
    mode_t mask = umask(0);
    umask(mask);
    chmod(o->tmp, 0777 & ~mask);
    return 0;
}

void cli_outdir_abort(cli_outdir *o) {
    if (o->tmp[0]) remove_tree(o->tmp);
    o->tmp[0] = '\0';
}

int cli_outdir_commit(const char *cmd, cli_outdir *o) {
    char parent[PATH_MAX];
    const char *slash = strrchr(o->final, '/');
    snprintf(parent, sizeof parent, "%.*s", slash == o->final ? 1 : (int)(slash - o->final), o->final);
    if (sync_dir(o->tmp) != 0) {
        fprintf(stderr, "nvfp4moe %s: fsync %s: %s\n", cmd, o->tmp, strerror(errno));
        cli_outdir_abort(o);
        return -1;
    }
    int rc;
    char old[PATH_MAX + 8] = "";   // where the replaced tree is, to delete ("": nothing replaced)
    if (!o->replace) {
        rc = rename(o->tmp, o->final);   // onto nothing, or onto an empty directory
    } else {
        rc = renameat2(AT_FDCWD, o->tmp, AT_FDCWD, o->final, RENAME_EXCHANGE);
        if (rc == 0) {
            snprintf(old, sizeof old, "%s", o->tmp);   // the exchange left the old tree there
        } else if (errno == EINVAL || errno == ENOSYS) {
            // No atomic exchange here: move the old tree aside, then the new one in.
            snprintf(old, sizeof old, "%s.old", o->tmp);
            rc = rename(o->final, old);
            if (rc == 0 && (rc = rename(o->tmp, o->final)) != 0) rename(old, o->final);
        }
    }
    if (rc != 0) {
        fprintf(stderr, "nvfp4moe %s: cannot put %s in place: %s\n", cmd, o->final, strerror(errno));
        cli_outdir_abort(o);
        return -1;
    }
    if (sync_dir(parent) != 0)
        fprintf(stderr, "nvfp4moe %s: warning: fsync %s: %s\n", cmd, parent, strerror(errno));
    if (old[0] && remove_tree(old) != 0)
        fprintf(stderr, "nvfp4moe %s: warning: the replaced output is left in %s: %s\n", cmd, old, strerror(errno));
    o->tmp[0] = '\0';
    return 0;
}
