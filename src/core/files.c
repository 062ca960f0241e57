/*
 * files.c - the small files the library reads and writes whole (config.json, indexes), and the one
 * way it opens a file for reading: only regular files, never blocking in open().
 */
#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

nvfp4moe_status nvfp4moe_open_regular(const char *path, int *fd_out, uint64_t *size) {
    // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer. fstat then decides.
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return nvfp4moe_set_error(errno == ENOENT ? NVFP4MOE_ERR_NOT_FOUND : NVFP4MOE_ERR_IO,
                                  "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    nvfp4moe_status s = NVFP4MOE_OK;
    if (fstat(fd, &st) != 0)
        s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: not a regular file (%s)", path,
                               S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
                               : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)            ? "a device"
                                                                                       : "a socket or other");
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: fcntl: %s", path, strerror(errno));
    if (s != NVFP4MOE_OK) {
        close(fd);
        return s;
    }
    *fd_out = fd;
    *size = (uint64_t)st.st_size;
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_read_text_file(const char *path, size_t max_bytes, char **out) {
    int fd;
    uint64_t size;
    NVFP4MOE_TRY(nvfp4moe_open_regular(path, &fd, &size));
    if (size > max_bytes) {
        close(fd);
        return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT, "%s: %llu bytes, larger than %zu", path,
                                  (unsigned long long)size, max_bytes);
    }
    // Read until end of file, at most max_bytes: the file may change size after the fstat.
    size_t cap = (size_t)size + 1, n = 0;
    char *buf = malloc(cap);
    nvfp4moe_status s = NVFP4MOE_OK;
    while (buf) {
        if (n + 1 >= cap) {
            if (cap > max_bytes) {
                s = nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT, "%s: larger than %zu bytes", path, max_bytes);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (!buf) return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    if (s != NVFP4MOE_OK) {
        free(buf);
        return s;
    }
    buf[n] = '\0';
    *out = buf;
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_sync_parent_dir(const char *path) {
    char dir[4096];
    nvfp4moe_strlcpy(dir, path, sizeof dir);
    char *slash = strrchr(dir, '/');
    if (!slash) nvfp4moe_strlcpy(dir, ".", sizeof dir);
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    NVFP4MOE_RETURN_IF(fd < 0, NVFP4MOE_ERR_IO, "%s: cannot open to sync: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    NVFP4MOE_RETURN_IF(rc != 0, NVFP4MOE_ERR_IO, "%s: fsync: %s", dir, strerror(err));
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_commit_file(FILE *f, const char *tmp, const char *path) {
    int err = 0;
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) err = errno;
    if (fclose(f) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        remove(tmp);
        return nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: cannot write: %s", path, strerror(err));
    }
    return nvfp4moe_sync_parent_dir(path);
}

nvfp4moe_status nvfp4moe_write_text_file(const char *path, const char *text) {
    size_t plen = strlen(path) + 8;
    char *tmp = malloc(plen);
    NVFP4MOE_RETURN_IF(!tmp, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    snprintf(tmp, plen, "%s.tmp", path);
    nvfp4moe_status s;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        size_t n = strlen(text);
        if (fwrite(text, 1, n, f) != n) {
            int err = errno;
            fclose(f);
            remove(tmp);
            s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: cannot write: %s", tmp, strerror(err));
        } else {
            s = nvfp4moe_commit_file(f, tmp, path);
        }
    }
    free(tmp);
    return s;
}
