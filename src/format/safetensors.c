/*
 * safetensors.c - a memory-mapped, zero-copy safetensors reader that enforces every rule of the
 * format, multi-shard models (model.safetensors.index.json), and a small writer.
 *
 * The reader trusts nothing in the file: every length and offset is checked against the mapping
 * before a byte behind it is touched, and all arithmetic on sizes is overflow-checked. JSON is
 * parsed by jansson with an explicit length, so the header needs no terminator.
 */
#include "core/internal.h"
#include "format/format.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// ---- dtypes ----

static const struct {
    const char *name;
    int bits;
} k_dtypes[NVFP4MOE_ST_DTYPE_COUNT] = {
    [NVFP4MOE_ST_BOOL] = {"BOOL", 8},           [NVFP4MOE_ST_U8] = {"U8", 8},
    [NVFP4MOE_ST_I8] = {"I8", 8},               [NVFP4MOE_ST_F8_E5M2] = {"F8_E5M2", 8},
    [NVFP4MOE_ST_F8_E4M3] = {"F8_E4M3", 8},     [NVFP4MOE_ST_F8_E8M0] = {"F8_E8M0", 8},
    [NVFP4MOE_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8}, [NVFP4MOE_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [NVFP4MOE_ST_I16] = {"I16", 16},            [NVFP4MOE_ST_U16] = {"U16", 16},
    [NVFP4MOE_ST_F16] = {"F16", 16},            [NVFP4MOE_ST_BF16] = {"BF16", 16},
    [NVFP4MOE_ST_I32] = {"I32", 32},            [NVFP4MOE_ST_U32] = {"U32", 32},
    [NVFP4MOE_ST_F32] = {"F32", 32},            [NVFP4MOE_ST_C64] = {"C64", 64},
    [NVFP4MOE_ST_F64] = {"F64", 64},            [NVFP4MOE_ST_I64] = {"I64", 64},
    [NVFP4MOE_ST_U64] = {"U64", 64},            [NVFP4MOE_ST_F4] = {"F4", 4},
    [NVFP4MOE_ST_F6_E2M3] = {"F6_E2M3", 6},     [NVFP4MOE_ST_F6_E3M2] = {"F6_E3M2", 6},
};

const char *nvfp4moe_st_dtype_name(nvfp4moe_st_dtype d) {
    return (unsigned)d < NVFP4MOE_ST_DTYPE_COUNT ? k_dtypes[d].name : "?";
}

int nvfp4moe_st_dtype_bits(nvfp4moe_st_dtype d) {
    return (unsigned)d < NVFP4MOE_ST_DTYPE_COUNT ? k_dtypes[d].bits : 0;
}

nvfp4moe_status nvfp4moe_st_dtype_parse(const char *s, nvfp4moe_st_dtype *out) {
    NVFP4MOE_RETURN_IF(!s || !out, NVFP4MOE_ERR_INVALID_ARGUMENT, "st_dtype_parse: NULL argument");
    for (int i = 0; i < NVFP4MOE_ST_DTYPE_COUNT; i++) {
        if (!strcmp(s, k_dtypes[i].name)) {
            *out = (nvfp4moe_st_dtype)i;
            return NVFP4MOE_OK;
        }
    }
    return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND, "unknown safetensors dtype '%s'", s);
}

/* numel * bits / 8 with overflow checks. Returns false when it overflows or is not whole bytes
 * (*misaligned tells which). */
static bool tensor_bytes(int64_t numel, int bits, uint64_t *out, bool *misaligned) {
    *misaligned = false;
    if (numel < 0) return false;
    uint64_t n = (uint64_t)numel;
    if (n > UINT64_MAX / (uint64_t)bits) return false;
    uint64_t total_bits = n * (uint64_t)bits;
    if (total_bits % 8) {
        *misaligned = true;
        return false;
    }
    *out = total_bits / 8;
    return true;
}

// ---- one file ----

struct nvfp4moe_st_file {
    char *path;
    int fd;                  /* open while the file is: nvfp4moe_st_tensor_read reads through it */
    uint64_t data_start;     /* file offset of the data section */
    const uint8_t *map;      /* the whole file, read-only */
    size_t map_size;
    const uint8_t *data;     /* start of the data section */
    uint64_t data_size;
    json_t *root;            /* owns the tensor names and metadata strings */
    nvfp4moe_st_tensor *tensors; /* in data order */
    size_t count;
    const nvfp4moe_st_tensor **by_name; /* sorted by name */
};

static int cmp_offset(const void *a, const void *b) {
    const nvfp4moe_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_name_ptr(const void *a, const void *b) {
    const nvfp4moe_st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Frees a file whatever owns it (the caller, or a model it belongs to). */
static void file_release(nvfp4moe_st_file *f) {
    if (f->map && f->map_size) munmap((void *)f->map, f->map_size);
    if (f->fd >= 0) close(f->fd);
    if (f->root) json_decref(f->root);
    free(f->tensors);
    free(f->by_name);
    free(f->path);
    free(f);
}

void nvfp4moe_st_close(nvfp4moe_st_file *f) {
    if (nvfp4moe_handle_remove(f, NVFP4MOE_HANDLE_ST_FILE)) file_release(f);   // else NULL, closed, or not ours
}

/* Reads n bytes at file offset off with pread. A short read means the file shrank since it was
 * opened: an IO error (what names the part being read; NULL: the caller names it). */
static nvfp4moe_status read_at(const nvfp4moe_st_file *f, uint64_t off, uint64_t n, void *dst, const char *what) {
    uint64_t got = 0;
    while (got < n) {
        size_t chunk = n - got > ((size_t)1 << 30) ? (size_t)1 << 30 : (size_t)(n - got);
        ssize_t r = pread(f->fd, (uint8_t *)dst + got, chunk, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            return what ? nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: reading %s: %s", f->path, what, strerror(errno))
                        : nvfp4moe_set_error(NVFP4MOE_ERR_IO, "read failed: %s", strerror(errno));
        }
        if (r == 0) {
            return what ? nvfp4moe_set_error(NVFP4MOE_ERR_IO,
                                             "%s: reading %s: the file ends at byte %llu: it changed size since "
                                             "it was opened (truncated while in use?)",
                                             f->path, what, (unsigned long long)(off + got))
                        : nvfp4moe_set_error(NVFP4MOE_ERR_IO,
                                             "the file ends at byte %llu: it changed size since it was opened "
                                             "(truncated while in use?)",
                                             (unsigned long long)(off + got));
        }
        got += (uint64_t)r;
    }
    return NVFP4MOE_OK;
}

/* Parses one header entry into t (name already set). Messages name the file and tensor. */
static nvfp4moe_status parse_entry(const char *path, const char *name, json_t *v,
                                   uint64_t data_size, nvfp4moe_st_tensor *t) {
    NVFP4MOE_RETURN_IF(!json_is_object(v), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': header entry is not a JSON object", path, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    NVFP4MOE_RETURN_IF(!jd || !json_is_string(jd), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': missing or non-string \"dtype\"", path, name);
    NVFP4MOE_RETURN_IF(!js || !json_is_array(js), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': missing or non-array \"shape\"", path, name);
    NVFP4MOE_RETURN_IF(!jo || !json_is_array(jo) || json_array_size(jo) != 2, NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': \"data_offsets\" must be an array [begin, end]", path, name);
    const char *ds = json_string_value(jd);
    if (nvfp4moe_st_dtype_parse(ds, &t->dtype) != NVFP4MOE_OK)
        return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", path,
                                  name, ds);
    size_t nd = json_array_size(js);
    NVFP4MOE_RETURN_IF(nd > NVFP4MOE_ST_MAX_DIMS, NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': %zu dimensions, more than %d", path, name, nd,
                       NVFP4MOE_ST_MAX_DIMS);
    t->ndim = (int32_t)nd;
    int64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        NVFP4MOE_RETURN_IF(!json_is_integer(d) || json_integer_value(d) < 0, NVFP4MOE_ERR_FORMAT,
                           "%s: tensor '%s': shape[%zu] is not a non-negative integer", path, name,
                           i);
        int64_t dim = (int64_t)json_integer_value(d);
        t->shape[i] = dim;
        // Keep multiplying after an overflow only to report it; a zero dim makes it empty.
        if (dim != 0 && numel > INT64_MAX / dim) overflow = true;
        else numel *= dim;
    }
    bool has_zero = false;
    for (size_t i = 0; i < nd; i++) has_zero |= t->shape[i] == 0;
    if (has_zero) numel = 0, overflow = false;
    NVFP4MOE_RETURN_IF(overflow, NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': absurd shape: element count overflows 64 bits", path, name);
    t->numel = numel;
    bool misaligned;
    uint64_t nbytes;
    if (!tensor_bytes(numel, nvfp4moe_st_dtype_bits(t->dtype), &nbytes, &misaligned)) {
        if (misaligned)
            return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT,
                                      "%s: tensor '%s': %lld elements of %s are not whole bytes",
                                      path, name, (long long)numel, ds);
        return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT,
                                  "%s: tensor '%s': absurd shape: byte size overflows 64 bits", path,
                                  name);
    }
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    NVFP4MOE_RETURN_IF(!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
                           json_integer_value(je) < 0,
                       NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets are not non-negative integers", path, name);
    uint64_t b = (uint64_t)json_integer_value(jb), e = (uint64_t)json_integer_value(je);
    NVFP4MOE_RETURN_IF(e < b, NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", path,
                       name, (unsigned long long)b, (unsigned long long)e);
    NVFP4MOE_RETURN_IF(e > data_size, NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the data "
                       "section (%llu bytes; truncated file?)",
                       path, name, (unsigned long long)b, (unsigned long long)e,
                       (unsigned long long)data_size);
    NVFP4MOE_RETURN_IF(e - b != nbytes, NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': shape and dtype %s need %llu bytes but data_offsets [%llu, "
                       "%llu] span %llu",
                       path, name, ds, (unsigned long long)nbytes, (unsigned long long)b,
                       (unsigned long long)e, (unsigned long long)(e - b));
    t->offset = b;
    t->nbytes = nbytes;
    return NVFP4MOE_OK;
}

/* Checks the header JSON and fills f->tensors. */
static nvfp4moe_status parse_header(nvfp4moe_st_file *f, const char *hdr, size_t hlen) {
    const char *path = f->path;
    // The format requires the header to start with '{' (no BOM, no leading whitespace).
    NVFP4MOE_RETURN_IF(hlen == 0 || hdr[0] != '{', NVFP4MOE_ERR_FORMAT,
                       "%s: header does not start with '{' (not a safetensors file?)", path);
    json_error_t err;
    f->root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &err);
    NVFP4MOE_RETURN_IF(!f->root, NVFP4MOE_ERR_FORMAT,
                       "%s: header is not valid JSON: %s at byte %d", path, err.text,
                       err.position);
    NVFP4MOE_RETURN_IF(!json_is_object(f->root), NVFP4MOE_ERR_FORMAT,
                       "%s: header is not a JSON object", path);
    size_t n = json_object_size(f->root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    f->by_name = calloc(n ? n : 1, sizeof *f->by_name);
    NVFP4MOE_RETURN_IF(!f->tensors || !f->by_name, NVFP4MOE_ERR_OUT_OF_MEMORY,
                       "%s: out of memory for %zu tensors", path, n);
    const char *key;
    json_t *v;
    size_t k = 0;
    json_object_foreach(f->root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            NVFP4MOE_RETURN_IF(!json_is_object(v), NVFP4MOE_ERR_FORMAT,
                               "%s: \"__metadata__\" is not a JSON object", path);
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                NVFP4MOE_RETURN_IF(!json_is_string(mv), NVFP4MOE_ERR_FORMAT,
                                   "%s: \"__metadata__\" value of '%s' is not a string", path, mk);
            }
            continue;
        }
        NVFP4MOE_RETURN_IF(key[0] == '\0', NVFP4MOE_ERR_FORMAT, "%s: a tensor has an empty name",
                           path);
        nvfp4moe_st_tensor *t = &f->tensors[k];
        t->name = key;
        t->file = f->path;
        NVFP4MOE_TRY(parse_entry(path, key, v, f->data_size, t));
        t->data = f->data + t->offset;
        t->file_ = f;
        k++;
    }
    f->count = k;
    // Data order: sorted, contiguous from 0, covering the whole data section.
    qsort(f->tensors, k, sizeof *f->tensors, cmp_offset);
    uint64_t expect = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < k; i++) {
        const nvfp4moe_st_tensor *t = &f->tensors[i];
        if (t->offset < expect)
            return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT,
                                      "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor "
                                      "'%s' (which ends at %llu)",
                                      path, t->name, (unsigned long long)t->offset,
                                      (unsigned long long)(t->offset + t->nbytes), prev,
                                      (unsigned long long)expect);
        if (t->offset > expect)
            return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT,
                                      "%s: tensor '%s': hole of %llu bytes before it (data_offsets "
                                      "begin at %llu, the previous tensor ends at %llu)",
                                      path, t->name, (unsigned long long)(t->offset - expect),
                                      (unsigned long long)t->offset, (unsigned long long)expect);
        expect = t->offset + t->nbytes;
        if (t->nbytes) prev = t->name;
    }
    NVFP4MOE_RETURN_IF(expect != f->data_size, NVFP4MOE_ERR_FORMAT,
                       "%s: %llu bytes after the last tensor are not covered by any tensor (data "
                       "section %llu bytes, tensors end at %llu)",
                       path, (unsigned long long)(f->data_size - expect),
                       (unsigned long long)f->data_size, (unsigned long long)expect);
    for (size_t i = 0; i < k; i++) f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, k, sizeof *f->by_name, cmp_name_ptr);
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_st_open(const char *path, nvfp4moe_st_file **out) {
    NVFP4MOE_RETURN_IF(!path || !out, NVFP4MOE_ERR_INVALID_ARGUMENT, "st_open: NULL argument");
    int fd;
    uint64_t size;
    NVFP4MOE_TRY(nvfp4moe_open_regular(path, &fd, &size));
    nvfp4moe_st_file *f = calloc(1, sizeof *f);
    char *p = strdup(path);
    if (!f || !p || nvfp4moe_handle_add(f, NVFP4MOE_HANDLE_ST_FILE) != NVFP4MOE_OK) {
        close(fd);
        free(f);
        free(p);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    f->path = p;
    f->fd = fd;
    nvfp4moe_status s = NVFP4MOE_OK;
    char *hdr = NULL;
    uint8_t len8[8];
    if (size < 8) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT,
                               "%s: file is %llu bytes, too short for the 8-byte header length "
                               "(truncated?)",
                               path, (unsigned long long)size);
        goto fail;
    }
    // The header is read, not mapped: a file that shrinks meanwhile gives a short read, not SIGBUS.
    if ((s = read_at(f, 0, 8, len8, "the header length")) != NVFP4MOE_OK) goto fail;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | len8[i];
    if (hlen > NVFP4MOE_ST_MAX_HEADER) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT,
                               "%s: header length %llu exceeds the %u-byte limit (corrupt header "
                               "length?)",
                               path, (unsigned long long)hlen, NVFP4MOE_ST_MAX_HEADER);
        goto fail;
    }
    if (hlen > size - 8) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT,
                               "%s: header length %llu runs past the end of the %llu-byte file "
                               "(truncated, or a lying header length)",
                               path, (unsigned long long)hlen, (unsigned long long)size);
        goto fail;
    }
    if (!(hdr = malloc(hlen ? (size_t)hlen : 1))) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: out of memory for a %llu-byte header", path,
                               (unsigned long long)hlen);
        goto fail;
    }
    if ((s = read_at(f, 8, hlen, hdr, "the header")) != NVFP4MOE_OK) goto fail;
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        goto fail;
    }
    f->map = m;
    f->map_size = (size_t)size;
    f->data_start = 8 + hlen;
    f->data = f->map + 8 + hlen;
    f->data_size = size - 8 - hlen;
    s = parse_header(f, hdr, (size_t)hlen);
    if (s != NVFP4MOE_OK) goto fail;
    free(hdr);
    *out = f;
    return NVFP4MOE_OK;
fail:
    free(hdr);
    nvfp4moe_st_close(f);
    return s;
}

nvfp4moe_status nvfp4moe_st_tensor_read(const nvfp4moe_st_tensor *t, uint64_t offset, uint64_t n, void *dst) {
    NVFP4MOE_RETURN_IF(!t || !t->file_ || (n && !dst), NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "st_tensor_read: NULL argument, or a tensor not from an open file");
    NVFP4MOE_RETURN_IF(offset > t->nbytes || n > t->nbytes - offset, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "%s: tensor '%s': bytes [%llu, %llu + %llu) are not inside its %llu bytes", t->file,
                       t->name, (unsigned long long)offset, (unsigned long long)offset, (unsigned long long)n,
                       (unsigned long long)t->nbytes);
    const nvfp4moe_st_file *f = t->file_;
    nvfp4moe_status s = read_at(f, f->data_start + t->offset + offset, n, dst, NULL);
    if (s != NVFP4MOE_OK) nvfp4moe_error_prefix("%s: tensor '%s'", f->path, t->name);
    return s;
}

const char *nvfp4moe_st_file_path(const nvfp4moe_st_file *f) { return f ? f->path : ""; }
size_t nvfp4moe_st_file_count(const nvfp4moe_st_file *f) { return f ? f->count : 0; }

const nvfp4moe_st_tensor *nvfp4moe_st_file_tensor(const nvfp4moe_st_file *f, size_t i) {
    return f && i < f->count ? &f->tensors[i] : NULL;
}

/* Binary search over an array of tensor pointers sorted by name: first index with name >= key. */
static size_t lower_bound(const nvfp4moe_st_tensor *const *v, size_t n, const char *key) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(v[mid]->name, key) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

const nvfp4moe_st_tensor *nvfp4moe_st_file_find(const nvfp4moe_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    size_t i = lower_bound(f->by_name, f->count, name);
    return i < f->count && !strcmp(f->by_name[i]->name, name) ? f->by_name[i] : NULL;
}

const char *nvfp4moe_st_file_metadata(const nvfp4moe_st_file *f, const char *key) {
    if (!f || !key || !f->root) return NULL;
    json_t *m = json_object_get(f->root, "__metadata__");
    return m ? json_string_value(json_object_get(m, key)) : NULL;
}

// ---- models: one or more files ----

/* model.safetensors.index.json: a 100k-tensor model's is about 10 MB. */
#define MAX_INDEX_BYTES (256u << 20)

struct nvfp4moe_st_model {
    nvfp4moe_st_file **files;
    size_t nfiles;
    const nvfp4moe_st_tensor **by_name;
    size_t count;
};

void nvfp4moe_st_model_close(nvfp4moe_st_model *m) {
    if (!nvfp4moe_handle_remove(m, NVFP4MOE_HANDLE_ST_MODEL)) return;   // NULL, closed already, or not ours
    for (size_t i = 0; i < m->nfiles; i++) file_release(m->files[i]);
    free(m->files);
    free(m->by_name);
    free(m);
}

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static nvfp4moe_status model_add_file(nvfp4moe_st_model *m, const char *path) {
    nvfp4moe_st_file **nf = realloc(m->files, (m->nfiles + 1) * sizeof *nf);
    NVFP4MOE_RETURN_IF(!nf, NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    m->files = nf;
    nvfp4moe_st_file *f = NULL;
    NVFP4MOE_TRY(nvfp4moe_st_open(path, &f));
    nvfp4moe_handle_remove(f, NVFP4MOE_HANDLE_ST_FILE);   // the model owns it now: st_close ignores it
    m->files[m->nfiles++] = f;
    return NVFP4MOE_OK;
}

/* A shard name from an index must stay inside the model directory. */
static bool safe_shard_name(const char *s) {
    if (!*s || s[0] == '/') return false;
    for (const char *p = s; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if ((n == 2 && p[0] == '.' && p[1] == '.') || n == 0) return false;
        p += n + (slash ? 1 : 0);
    }
    return true;
}

static nvfp4moe_status open_index(nvfp4moe_st_model *m, const char *dir, const char *index_path,
                                  json_t **index_out) {
    char *text = NULL;
    NVFP4MOE_TRY(nvfp4moe_read_text_file(index_path, MAX_INDEX_BYTES, &text));
    json_error_t err;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    free(text);
    NVFP4MOE_RETURN_IF(!root, NVFP4MOE_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", index_path,
                       err.text, err.line);
    *index_out = root;
    json_t *wm = json_object_get(root, "weight_map");
    NVFP4MOE_RETURN_IF(!json_is_object(wm), NVFP4MOE_ERR_FORMAT,
                       "%s: missing or non-object \"weight_map\"", index_path);
    // Open each distinct shard once, in the order the map first names it.
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        NVFP4MOE_RETURN_IF(!json_is_string(v), NVFP4MOE_ERR_FORMAT,
                           "%s: weight_map entry of tensor '%s' is not a file name", index_path,
                           key);
        const char *shard = json_string_value(v);
        NVFP4MOE_RETURN_IF(!safe_shard_name(shard), NVFP4MOE_ERR_FORMAT,
                           "%s: tensor '%s': shard name '%s' leaves the model directory",
                           index_path, key, shard);
        char *path = join_path(dir, shard);
        NVFP4MOE_RETURN_IF(!path, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        bool seen = false;
        for (size_t i = 0; i < m->nfiles && !seen; i++) seen = !strcmp(m->files[i]->path, path);
        nvfp4moe_status s = seen ? NVFP4MOE_OK : model_add_file(m, path);
        if (s != NVFP4MOE_OK) nvfp4moe_error_prefix("%s names shard '%s'", index_path, shard);
        free(path);
        if (s != NVFP4MOE_OK) return s;
    }
    return NVFP4MOE_OK;
}

static int cmp_cstr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static nvfp4moe_status open_all_in_dir(nvfp4moe_st_model *m, const char *dir) {
    DIR *d = opendir(dir);
    NVFP4MOE_RETURN_IF(!d, errno == ENOENT ? NVFP4MOE_ERR_NOT_FOUND : NVFP4MOE_ERR_IO,
                       "%s: cannot open directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    nvfp4moe_status s = NVFP4MOE_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l <= 12 || strcmp(e->d_name + l - 12, ".safetensors")) continue;
        char **nn = realloc(names, (n + 1) * sizeof *nn);
        char *copy = strdup(e->d_name);
        if (!nn || !copy) {
            free(copy);
            if (nn) names = nn;
            s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        names = nn;
        names[n++] = copy;
    }
    closedir(d);
    if (s == NVFP4MOE_OK && n == 0)
        s = nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND,
                               "%s: no model.safetensors.index.json, model.safetensors or "
                               "*.safetensors file",
                               dir);
    if (s == NVFP4MOE_OK) qsort(names, n, sizeof *names, cmp_cstr);
    for (size_t i = 0; i < n; i++) {
        if (s == NVFP4MOE_OK) {
            char *path = join_path(dir, names[i]);
            s = path ? model_add_file(m, path)
                     : nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
            free(path);
        }
        free(names[i]);
    }
    free(names);
    return s;
}

/* Builds the by-name table over all files, rejecting names held by two files, and checks each
 * index entry against its shard. */
static nvfp4moe_status model_finish(nvfp4moe_st_model *m, const char *dir, const char *index_path,
                                    json_t *index) {
    size_t total = 0;
    for (size_t i = 0; i < m->nfiles; i++) total += m->files[i]->count;
    m->by_name = calloc(total ? total : 1, sizeof *m->by_name);
    NVFP4MOE_RETURN_IF(!m->by_name, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < m->nfiles; i++)
        for (size_t j = 0; j < m->files[i]->count; j++)
            m->by_name[m->count++] = &m->files[i]->tensors[j];
    qsort(m->by_name, m->count, sizeof *m->by_name, cmp_name_ptr);
    for (size_t i = 1; i < m->count; i++)
        NVFP4MOE_RETURN_IF(!strcmp(m->by_name[i - 1]->name, m->by_name[i]->name),
                           NVFP4MOE_ERR_FORMAT, "%s: tensor '%s' is in both %s and %s", dir,
                           m->by_name[i]->name, m->by_name[i - 1]->file, m->by_name[i]->file);
    if (!index) return NVFP4MOE_OK;
    json_t *wm = json_object_get(index, "weight_map");
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const nvfp4moe_st_tensor *t = nvfp4moe_st_model_find(m, key);
        NVFP4MOE_RETURN_IF(!t, NVFP4MOE_ERR_NOT_FOUND,
                           "%s: tensor '%s' is mapped to shard '%s', which does not contain it",
                           index_path, key, json_string_value(v));
        const char *base = strrchr(t->file, '/');
        base = base ? base + 1 : t->file;
        const char *want = strrchr(json_string_value(v), '/');
        want = want ? want + 1 : json_string_value(v);
        NVFP4MOE_RETURN_IF(strcmp(base, want) != 0, NVFP4MOE_ERR_FORMAT,
                           "%s: tensor '%s' is mapped to shard '%s' but found in %s", index_path,
                           key, json_string_value(v), t->file);
    }
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_st_model_open(const char *path, nvfp4moe_st_model **out) {
    NVFP4MOE_RETURN_IF(!path || !out, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "st_model_open: NULL argument");
    nvfp4moe_st_model *m = calloc(1, sizeof *m);
    NVFP4MOE_RETURN_IF(!m, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    if (nvfp4moe_handle_add(m, NVFP4MOE_HANDLE_ST_MODEL) != NVFP4MOE_OK) {
        free(m);
        return NVFP4MOE_ERR_OUT_OF_MEMORY;
    }
    nvfp4moe_status s;
    json_t *index = NULL;
    char *index_path = NULL, *single = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        s = nvfp4moe_set_error(errno == ENOENT ? NVFP4MOE_ERR_NOT_FOUND : NVFP4MOE_ERR_IO,
                               "%s: %s", path, strerror(errno));
        goto done;
    }
    if (S_ISREG(st.st_mode)) {
        s = model_add_file(m, path);
        if (s == NVFP4MOE_OK) s = model_finish(m, path, NULL, NULL);
        goto done;
    }
    index_path = join_path(path, "model.safetensors.index.json");
    single = join_path(path, "model.safetensors");
    if (!index_path || !single) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    if (is_file(index_path)) s = open_index(m, path, index_path, &index);
    else if (is_file(single)) s = model_add_file(m, single);
    else s = open_all_in_dir(m, path);
    if (s == NVFP4MOE_OK) s = model_finish(m, path, index_path, index);
done:
    if (index) json_decref(index);
    free(index_path);
    free(single);
    if (s != NVFP4MOE_OK) {
        nvfp4moe_st_model_close(m);
        return s;
    }
    *out = m;
    return NVFP4MOE_OK;
}

size_t nvfp4moe_st_model_num_files(const nvfp4moe_st_model *m) { return m ? m->nfiles : 0; }

const nvfp4moe_st_file *nvfp4moe_st_model_file(const nvfp4moe_st_model *m, size_t i) {
    return m && i < m->nfiles ? m->files[i] : NULL;
}

size_t nvfp4moe_st_model_count(const nvfp4moe_st_model *m) { return m ? m->count : 0; }

const nvfp4moe_st_tensor *nvfp4moe_st_model_tensor(const nvfp4moe_st_model *m, size_t i) {
    return m && i < m->count ? m->by_name[i] : NULL;
}

size_t nvfp4moe_st_model_lower_bound(const nvfp4moe_st_model *m, const char *name) {
    return m && name ? lower_bound(m->by_name, m->count, name) : 0;
}

const nvfp4moe_st_tensor *nvfp4moe_st_model_find(const nvfp4moe_st_model *m, const char *name) {
    if (!m || !name) return NULL;
    size_t i = lower_bound(m->by_name, m->count, name);
    return i < m->count && !strcmp(m->by_name[i]->name, name) ? m->by_name[i] : NULL;
}

// ---- writer ----

typedef struct {
    char *name;
    nvfp4moe_st_dtype dtype;
    int32_t ndim;
    int64_t shape[NVFP4MOE_ST_MAX_DIMS];
    uint64_t nbytes;
    uint8_t *data;
} wtensor;

struct nvfp4moe_st_writer {
    wtensor *t;
    size_t n, cap;
    json_t *meta;   /* __metadata__ object, or NULL */
};

nvfp4moe_status nvfp4moe_st_writer_create(nvfp4moe_st_writer **out) {
    NVFP4MOE_RETURN_IF(!out, NVFP4MOE_ERR_INVALID_ARGUMENT, "st_writer_create: NULL out");
    nvfp4moe_st_writer *w = calloc(1, sizeof *w);
    NVFP4MOE_RETURN_IF(!w, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    if (nvfp4moe_handle_add(w, NVFP4MOE_HANDLE_ST_WRITER) != NVFP4MOE_OK) {
        free(w);
        return NVFP4MOE_ERR_OUT_OF_MEMORY;
    }
    *out = w;
    return NVFP4MOE_OK;
}

void nvfp4moe_st_writer_free(nvfp4moe_st_writer *w) {
    if (!nvfp4moe_handle_remove(w, NVFP4MOE_HANDLE_ST_WRITER)) return;   // NULL, freed already, or not ours
    for (size_t i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    if (w->meta) json_decref(w->meta);
    free(w);
}

/* The bytes of a tensor of this dtype and shape, checked (who names the caller in the message). */
static nvfp4moe_status shape_bytes(const char *who, const char *name, nvfp4moe_st_dtype dtype, int32_t ndim,
                                   const int64_t *shape, uint64_t *nbytes) {
    int64_t numel = 1;
    for (int32_t i = 0; i < ndim; i++) {
        NVFP4MOE_RETURN_IF(shape[i] < 0 || (shape[i] && numel > INT64_MAX / shape[i]), NVFP4MOE_ERR_SHAPE,
                           "%s: tensor '%s': bad shape[%d]=%lld", who, name, i, (long long)shape[i]);
        numel *= shape[i];
    }
    bool misaligned;
    NVFP4MOE_RETURN_IF(!tensor_bytes(numel, nvfp4moe_st_dtype_bits(dtype), nbytes, &misaligned), NVFP4MOE_ERR_SHAPE,
                       "%s: tensor '%s': size is not whole bytes", who, name);
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_st_writer_add(nvfp4moe_st_writer *w, const char *name,
                                       nvfp4moe_st_dtype dtype, int32_t ndim,
                                       const int64_t *shape, const void *data) {
    NVFP4MOE_RETURN_IF(!w || !name, NVFP4MOE_ERR_INVALID_ARGUMENT, "st_writer_add: NULL argument");
    NVFP4MOE_RETURN_IF(!*name || !strcmp(name, "__metadata__"), NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "st_writer_add: bad tensor name '%s'", name);
    NVFP4MOE_RETURN_IF((unsigned)dtype >= NVFP4MOE_ST_DTYPE_COUNT, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "st_writer_add: tensor '%s': bad dtype %d", name, (int)dtype);
    NVFP4MOE_RETURN_IF(ndim < 0 || ndim > NVFP4MOE_ST_MAX_DIMS || (ndim && !shape),
                       NVFP4MOE_ERR_INVALID_ARGUMENT, "st_writer_add: tensor '%s': bad ndim %d",
                       name, ndim);
    for (size_t i = 0; i < w->n; i++)
        NVFP4MOE_RETURN_IF(!strcmp(w->t[i].name, name), NVFP4MOE_ERR_INVALID_ARGUMENT,
                           "st_writer_add: tensor '%s' added twice", name);
    uint64_t nbytes;
    NVFP4MOE_TRY(shape_bytes("st_writer_add", name, dtype, ndim, shape, &nbytes));
    NVFP4MOE_RETURN_IF(nbytes && !data, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "st_writer_add: tensor '%s': NULL data", name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        wtensor *nt = realloc(w->t, cap * sizeof *nt);
        NVFP4MOE_RETURN_IF(!nt, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        w->t = nt;
        w->cap = cap;
    }
    wtensor t = {.dtype = dtype, .ndim = ndim, .nbytes = nbytes};
    t.name = strdup(name);
    t.data = malloc(nbytes ? (size_t)nbytes : 1);
    if (!t.name || !t.data) {
        free(t.name);
        free(t.data);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "st_writer_add: tensor '%s': out of "
                                  "memory", name);
    }
    for (int32_t i = 0; i < ndim; i++) t.shape[i] = shape[i];
    if (nbytes) memcpy(t.data, data, (size_t)nbytes);
    w->t[w->n++] = t;
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_st_writer_set_metadata(nvfp4moe_st_writer *w, const char *key,
                                                const char *value) {
    NVFP4MOE_RETURN_IF(!w || !key || !value, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "st_writer_set_metadata: NULL argument");
    if (!w->meta) w->meta = json_object();
    NVFP4MOE_RETURN_IF(!w->meta || json_object_set_new(w->meta, key, json_string(value)) != 0,
                       NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "st_writer_set_metadata: cannot store '%s' (not UTF-8?)", key);
    return NVFP4MOE_OK;
}

/* Encodes a header object (ok: it was built without error) as text padded with spaces to a
 * multiple of 8; consumes root. who names the writer in the message. Caller frees *out. */
static nvfp4moe_status pad_header(json_t *root, bool ok, const char *who, char **out, size_t *len) {
    char *text = ok ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    NVFP4MOE_RETURN_IF(!text, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s: cannot encode the header (tensor names must be UTF-8)",
                       who);
    size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    char *buf = malloc(padded);
    if (!buf) {
        free(text);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    memcpy(buf, text, n);
    memset(buf + n, ' ', padded - n);
    free(text);
    *out = buf;
    *len = padded;
    return NVFP4MOE_OK;
}

/* The header text, padded with spaces to a multiple of 8. Caller frees. */
static nvfp4moe_status writer_header(const nvfp4moe_st_writer *w, char **out, size_t *len) {
    json_t *root = json_object();
    NVFP4MOE_RETURN_IF(!root, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    bool ok = true;
    if (w->meta) ok = json_object_set(root, "__metadata__", w->meta) == 0;
    uint64_t off = 0;
    for (size_t i = 0; i < w->n && ok; i++) {
        const wtensor *t = &w->t[i];
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        ok = e && shape && offs;
        for (int32_t d = 0; d < t->ndim && ok; d++)
            ok = json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) == 0;
        ok = ok && json_array_append_new(offs, json_integer((json_int_t)off)) == 0 &&
             json_array_append_new(offs, json_integer((json_int_t)(off + t->nbytes))) == 0;
        ok = ok && json_object_set_new(e, "dtype", json_string(nvfp4moe_st_dtype_name(t->dtype))) == 0 &&
             json_object_set(e, "shape", shape) == 0 && json_object_set(e, "data_offsets", offs) == 0;
        ok = ok && json_object_set(root, t->name, e) == 0;
        if (e) json_decref(e);
        if (shape) json_decref(shape);
        if (offs) json_decref(offs);
        off += t->nbytes;
    }
    return pad_header(root, ok, "st_writer_save", out, len);
}

nvfp4moe_status nvfp4moe_st_writer_save(const nvfp4moe_st_writer *w, const char *path) {
    NVFP4MOE_RETURN_IF(!w || !path, NVFP4MOE_ERR_INVALID_ARGUMENT, "st_writer_save: NULL argument");
    char *hdr = NULL;
    size_t hlen = 0;
    NVFP4MOE_TRY(writer_header(w, &hdr, &hlen));
    size_t plen = strlen(path) + 8;
    char *tmp = malloc(plen);
    if (!tmp) {
        free(hdr);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    snprintf(tmp, plen, "%s.tmp", path);
    nvfp4moe_status s = NVFP4MOE_OK;
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    bool ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(hdr, 1, hlen, fp) == hlen;
    for (size_t i = 0; i < w->n && ok; i++)
        ok = fwrite(w->t[i].data, 1, (size_t)w->t[i].nbytes, fp) == w->t[i].nbytes;
    if (!ok) {
        int err = errno;
        fclose(fp);
        remove(tmp);
        s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: write failed: %s", tmp, strerror(err));
        goto done;
    }
    s = nvfp4moe_commit_file(fp, tmp, path);
done:
    free(tmp);
    free(hdr);
    return s;
}

// ---- sharded writing ----

typedef struct {
    char *name;
    nvfp4moe_st_dtype dtype;
    int32_t ndim;
    int64_t shape[NVFP4MOE_ST_MAX_DIMS];
    uint64_t nbytes;
    int32_t shard;
    uint64_t offset;          /* file offset of its data */
    uint64_t written;         /* bytes written so far */
} stensor;

typedef struct {
    char *path;
    int fd;
    uint64_t data_start;
} sshard;

struct nvfp4moe_st_shards {
    stensor *t;
    size_t n, cap;
    sshard *f;
    int32_t nfiles;
    char *dir;
    bool finished;            /* the files stay when freed */
    bool indexed;             /* model.safetensors.index.json was written */
};

nvfp4moe_status nvfp4moe_st_shards_create(nvfp4moe_st_shards **out) {
    NVFP4MOE_RETURN_IF(!out, NVFP4MOE_ERR_INVALID_ARGUMENT, "st_shards_create: NULL out");
    *out = calloc(1, sizeof **out);
    NVFP4MOE_RETURN_IF(!*out, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    return NVFP4MOE_OK;
}

void nvfp4moe_st_shards_discard(nvfp4moe_st_shards *s) {
    if (!s) return;
    s->finished = false;
    if (s->indexed) {
        char *path = join_path(s->dir, "model.safetensors.index.json");
        if (path) unlink(path);
        free(path);
        s->indexed = false;
    }
}

void nvfp4moe_st_shards_free(nvfp4moe_st_shards *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->nfiles; i++) {
        if (s->f[i].fd >= 0) close(s->f[i].fd);
        if (!s->finished && s->f[i].path) unlink(s->f[i].path);
        free(s->f[i].path);
    }
    for (size_t i = 0; i < s->n; i++) free(s->t[i].name);
    free(s->f);
    free(s->t);
    free(s->dir);
    free(s);
}

nvfp4moe_status nvfp4moe_st_shards_add(nvfp4moe_st_shards *s, const char *name, nvfp4moe_st_dtype dtype,
                                       int32_t ndim, const int64_t *shape, int64_t *index) {
    NVFP4MOE_RETURN_IF(!s || !name || !*name || !strcmp(name, "__metadata__") || s->nfiles, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "st_shards_add: bad argument (tensor '%s')", name ? name : "(null)");
    NVFP4MOE_RETURN_IF((unsigned)dtype >= NVFP4MOE_ST_DTYPE_COUNT || ndim < 0 || ndim > NVFP4MOE_ST_MAX_DIMS ||
                           (ndim && !shape),
                       NVFP4MOE_ERR_INVALID_ARGUMENT, "st_shards_add: tensor '%s': bad dtype or ndim", name);
    uint64_t nbytes;
    NVFP4MOE_TRY(shape_bytes("st_shards_add", name, dtype, ndim, shape, &nbytes));
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        stensor *nt = realloc(s->t, cap * sizeof *nt);
        NVFP4MOE_RETURN_IF(!nt, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        s->t = nt;
        s->cap = cap;
    }
    stensor t = {.dtype = dtype, .ndim = ndim, .nbytes = nbytes};
    for (int32_t i = 0; i < ndim; i++) t.shape[i] = shape[i];
    NVFP4MOE_RETURN_IF(!(t.name = strdup(name)), NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    if (index) *index = (int64_t)s->n;
    s->t[s->n++] = t;
    return NVFP4MOE_OK;
}

uint64_t nvfp4moe_st_shards_bytes(const nvfp4moe_st_shards *s, int64_t i) {
    return s && i >= 0 && (size_t)i < s->n ? s->t[i].nbytes : 0;
}
const char *nvfp4moe_st_shards_name(const nvfp4moe_st_shards *s, int64_t i) {
    return s && i >= 0 && (size_t)i < s->n ? s->t[i].name : "";
}
int64_t nvfp4moe_st_shards_count(const nvfp4moe_st_shards *s) { return s ? (int64_t)s->n : 0; }
int32_t nvfp4moe_st_shards_files(const nvfp4moe_st_shards *s) { return s ? s->nfiles : 0; }

static int cmp_stensor_name(const void *a, const void *b) {
    const stensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Writes all of buf at file offset off. */
static bool pwrite_all(int fd, const void *buf, size_t n, uint64_t off) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k, n -= (size_t)k, off += (uint64_t)k;
    }
    return true;
}

/* The header of shard f (its tensors in order), padded with spaces to a multiple of 8. */
static nvfp4moe_status shard_header(const nvfp4moe_st_shards *s, int32_t f, char **out, size_t *len) {
    json_t *root = json_object();
    NVFP4MOE_RETURN_IF(!root, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    bool ok = json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt")) == 0;
    uint64_t off = 0;
    for (size_t i = 0; i < s->n && ok; i++) {
        const stensor *t = &s->t[i];
        if (t->shard != f) continue;
        json_t *shape = json_array();
        for (int32_t d = 0; d < t->ndim && shape; d++)
            if (json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) != 0) ok = false;
        json_t *e = shape ? json_pack("{s:s,s:o,s:[I,I]}", "dtype", nvfp4moe_st_dtype_name(t->dtype), "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + t->nbytes))
                          : NULL;
        ok = ok && e && json_object_set_new(root, t->name, e) == 0;
        off += t->nbytes;
    }
    return pad_header(root, ok, "st_shards_layout", out, len);
}

nvfp4moe_status nvfp4moe_st_shards_layout(nvfp4moe_st_shards *s, uint64_t max_shard_bytes, const char *dir) {
    NVFP4MOE_RETURN_IF(!s || !dir || !max_shard_bytes || s->nfiles || !s->n, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "st_shards_layout: bad argument");
    // Names must be unique: sort pointers once.
    const stensor **by = malloc(sizeof *by * s->n);
    NVFP4MOE_RETURN_IF(!by, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < s->n; i++) by[i] = &s->t[i];
    qsort(by, s->n, sizeof *by, cmp_stensor_name);
    const char *dup = NULL;
    for (size_t i = 1; i < s->n && !dup; i++)
        if (!strcmp(by[i - 1]->name, by[i]->name)) dup = by[i]->name;
    free(by);
    NVFP4MOE_RETURN_IF(dup, NVFP4MOE_ERR_INVALID_ARGUMENT, "safetensors: tensor '%s' would be written twice", dup);
    int32_t shard = 0;
    uint64_t size = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (size > 0 && size + s->t[i].nbytes > max_shard_bytes) shard++, size = 0;
        s->t[i].shard = shard;
        size += s->t[i].nbytes;
    }
    const int32_t nfiles = shard + 1;
    NVFP4MOE_RETURN_IF(nfiles > 99999, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "safetensors: %d shards of at most %llu bytes: more than 99999 files", nfiles,
                       (unsigned long long)max_shard_bytes);
    s->f = calloc((size_t)nfiles, sizeof *s->f);
    s->dir = strdup(dir);
    NVFP4MOE_RETURN_IF(!s->f || !s->dir, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    s->nfiles = nfiles;
    for (int32_t f = 0; f < nfiles; f++) s->f[f].fd = -1;
    for (int32_t f = 0; f < nfiles; f++) {
        char name[64];
        if (nfiles == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f + 1, nfiles);
        s->f[f].path = join_path(dir, name);
        NVFP4MOE_RETURN_IF(!s->f[f].path, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        s->f[f].fd = open(s->f[f].path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (s->f[f].fd < 0) {
            const int err = errno;
            free(s->f[f].path);   // not ours: never removed
            s->f[f].path = NULL;
            return nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s/%s: cannot create: %s", dir, name, strerror(err));
        }
        char *hdr = NULL;
        size_t hlen = 0;
        NVFP4MOE_TRY(shard_header(s, f, &hdr, &hlen));
        uint8_t len8[8];
        for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
        const bool ok = pwrite_all(s->f[f].fd, len8, 8, 0) && pwrite_all(s->f[f].fd, hdr, hlen, 8);
        const int err = errno;
        free(hdr);
        NVFP4MOE_RETURN_IF(!ok, NVFP4MOE_ERR_IO, "%s: write failed: %s", s->f[f].path, strerror(err));
        s->f[f].data_start = 8 + hlen;
    }
    uint64_t *next = calloc((size_t)nfiles, sizeof *next);   // per shard, the next tensor's data offset
    NVFP4MOE_RETURN_IF(!next, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < s->n; i++) {
        stensor *t = &s->t[i];
        t->offset = s->f[t->shard].data_start + next[t->shard];
        next[t->shard] += t->nbytes;
    }
    free(next);
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_st_shards_write(nvfp4moe_st_shards *s, int64_t index, uint64_t offset, const void *data,
                                         uint64_t n) {
    NVFP4MOE_RETURN_IF(!s || !s->nfiles || index < 0 || (size_t)index >= s->n || (n && !data),
                       NVFP4MOE_ERR_INVALID_ARGUMENT, "st_shards_write: bad argument");
    stensor *t = &s->t[index];
    NVFP4MOE_RETURN_IF(offset > t->nbytes || n > t->nbytes - offset, NVFP4MOE_ERR_INTERNAL,
                       "st_shards_write: tensor '%s': bytes [%llu, %llu) outside its %llu", t->name,
                       (unsigned long long)offset, (unsigned long long)(offset + n), (unsigned long long)t->nbytes);
    sshard *f = &s->f[t->shard];
    NVFP4MOE_RETURN_IF(n && !pwrite_all(f->fd, data, (size_t)n, t->offset + offset), NVFP4MOE_ERR_IO,
                       "%s: tensor '%s': write failed: %s", f->path, t->name, strerror(errno));
    t->written += n;
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_st_shards_finish(nvfp4moe_st_shards *s) {
    NVFP4MOE_RETURN_IF(!s || !s->nfiles || s->finished, NVFP4MOE_ERR_INVALID_ARGUMENT, "st_shards_finish: bad argument");
    for (size_t i = 0; i < s->n; i++)
        NVFP4MOE_RETURN_IF(s->t[i].written != s->t[i].nbytes, NVFP4MOE_ERR_INTERNAL,
                           "safetensors: tensor '%s': %llu of its %llu bytes written", s->t[i].name,
                           (unsigned long long)s->t[i].written, (unsigned long long)s->t[i].nbytes);
    for (int32_t f = 0; f < s->nfiles; f++) {
        const int rc = fsync(s->f[f].fd), err = errno;
        const int rc2 = close(s->f[f].fd);
        s->f[f].fd = -1;
        NVFP4MOE_RETURN_IF(rc != 0 || rc2 != 0, NVFP4MOE_ERR_IO, "%s: cannot write: %s", s->f[f].path,
                           strerror(rc ? err : errno));
    }
    NVFP4MOE_TRY(nvfp4moe_sync_parent_dir(s->f[0].path));
    if (s->nfiles > 1) {
        // model.safetensors.index.json, as Hugging Face writes it: the tensor bytes, the sorted map.
        json_t *root = json_object(), *map = json_object();
        uint64_t total = 0;
        bool ok = root && map;
        for (size_t i = 0; i < s->n && ok; i++) {
            total += s->t[i].nbytes;
            const char *base = strrchr(s->f[s->t[i].shard].path, '/');
            ok = json_object_set_new(map, s->t[i].name, json_string(base ? base + 1 : s->f[s->t[i].shard].path)) == 0;
        }
        ok = ok && json_object_set_new(root, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total)) == 0 &&
             json_object_set(root, "weight_map", map) == 0;
        char *text = ok ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        if (root) json_decref(root);
        if (map) json_decref(map);
        NVFP4MOE_RETURN_IF(!text, NVFP4MOE_ERR_OUT_OF_MEMORY, "model.safetensors.index.json: out of memory");
        char *path = join_path(s->dir, "model.safetensors.index.json");
        nvfp4moe_status st = path ? nvfp4moe_write_text_file(path, text)
                                  : nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        free(path);
        free(text);
        NVFP4MOE_TRY(st);
        s->indexed = true;
    }
    s->finished = true;
    return NVFP4MOE_OK;
}
