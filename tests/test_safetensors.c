/*
 * test_safetensors.c - the safetensors reader and writer: a round trip over every dtype class, and
 * a corpus of broken files built at test time, each of which must fail with its own message (and,
 * under tests/sanitize.sh, without reading a byte out of bounds). Multi-shard models and their index.
 */
#include "harness.h"
#include "nvfp4moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

static const char *path_in(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* Writes a raw file: 8-byte little-endian hlen, then header text, then ndata bytes of data. */
static void write_raw(const char *path, uint64_t hlen, const char *header, size_t ndata) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(hlen >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < ndata; i++) fputc((int)(i * 7 + 1) & 0xFF, f);
    fclose(f);
}

/* A header with its true length. */
static void write_hdr(const char *path, const char *header, size_t ndata) {
    write_raw(path, strlen(header), header, ndata);
}

/* Opening path must fail with status st and a message naming the file and containing needle. */
static void expect_broken(const char *what, const char *path, nvfp4moe_status st,
                          const char *needle) {
    T_CASE(what);
    nvfp4moe_st_file *f = (nvfp4moe_st_file *)0x1;
    CHECK_ERR(nvfp4moe_st_open(path, &f), st, needle);
    CHECK(f == (nvfp4moe_st_file *)0x1, "output written on failure");
    CHECK(strstr(nvfp4moe_last_error(), path) != NULL, "message does not name the file: %s",
          nvfp4moe_last_error());
}

static void test_round_trip(void) {
    T_CASE("writer/reader round trip");
    nvfp4moe_st_writer *w = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    float f32[6] = {1, -2, 3.5f, 0, 1e-3f, 42};
    uint16_t bf16[4] = {0x3f80, 0xbf80, 0x4000, 0x0000};
    uint8_t u8 = 0xAB, e4m3[2 * 16], f4[2] = {0x21, 0x43};
    for (int i = 0; i < 32; i++) e4m3[i] = (uint8_t)i;
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s216[2] = {2, 16}, s05[2] = {0, 5};
    CHECK_OK(nvfp4moe_st_writer_add(w, "a.f32", NVFP4MOE_ST_F32, 2, s23, f32));
    CHECK_OK(nvfp4moe_st_writer_add(w, "b.bf16", NVFP4MOE_ST_BF16, 1, s4, bf16));
    CHECK_OK(nvfp4moe_st_writer_add(w, "c.scalar", NVFP4MOE_ST_U8, 0, NULL, &u8));
    CHECK_OK(nvfp4moe_st_writer_add(w, "d.scale", NVFP4MOE_ST_F8_E4M3, 2, s216, e4m3));
    CHECK_OK(nvfp4moe_st_writer_add(w, "e.empty", NVFP4MOE_ST_I32, 2, s05, NULL));
    CHECK_OK(nvfp4moe_st_writer_add(w, "f.fp4", NVFP4MOE_ST_F4, 1, s4, f4));
    CHECK_OK(nvfp4moe_st_writer_set_metadata(w, "format", "pt"));
    CHECK_ERR(nvfp4moe_st_writer_add(w, "a.f32", NVFP4MOE_ST_F32, 2, s23, f32),
              NVFP4MOE_ERR_INVALID_ARGUMENT, "added twice");
    CHECK_ERR(nvfp4moe_st_writer_add(w, "__metadata__", NVFP4MOE_ST_F32, 2, s23, f32),
              NVFP4MOE_ERR_INVALID_ARGUMENT, "bad tensor name");
    int64_t s3[1] = {3};
    CHECK_ERR(nvfp4moe_st_writer_add(w, "odd.fp4", NVFP4MOE_ST_F4, 1, s3, f4), NVFP4MOE_ERR_SHAPE,
              "not whole bytes");
    const char *p = path_in("rt.safetensors");
    CHECK_OK(nvfp4moe_st_writer_save(w, p));
    nvfp4moe_st_writer_free(w);

    // The header is padded with spaces to a multiple of 8 and starts with '{'.
    FILE *fp = fopen(p, "rb");
    uint8_t head[9] = {0};
    CHECK(fp && fread(head, 1, 9, fp) == 9, "cannot read back %s", p);
    if (fp) fclose(fp);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | head[i];
    CHECK(hlen % 8 == 0 && head[8] == '{', "header length %llu, first byte '%c'",
          (unsigned long long)hlen, head[8]);
    CHECK(access(path_in("rt.safetensors.tmp"), F_OK) != 0, "temporary file left behind");

    nvfp4moe_st_file *f = NULL;
    CHECK_OK(nvfp4moe_st_open(p, &f));
    if (!f) return;
    CHECK(nvfp4moe_st_file_count(f) == 6, "count %zu", nvfp4moe_st_file_count(f));
    const nvfp4moe_st_tensor *t = nvfp4moe_st_file_find(f, "a.f32");
    CHECK(t && t->dtype == NVFP4MOE_ST_F32 && t->ndim == 2 && t->shape[0] == 2 &&
              t->shape[1] == 3 && t->numel == 6 && t->nbytes == 24 && t->offset == 0,
          "a.f32 wrong");
    CHECK(t && !memcmp(t->data, f32, sizeof f32), "a.f32 data");
    t = nvfp4moe_st_file_find(f, "b.bf16");
    CHECK(t && t->dtype == NVFP4MOE_ST_BF16 && t->offset == 24 && !memcmp(t->data, bf16, 8),
          "b.bf16 wrong");
    t = nvfp4moe_st_file_find(f, "c.scalar");
    CHECK(t && t->ndim == 0 && t->numel == 1 && t->nbytes == 1 && *(const uint8_t *)t->data == 0xAB,
          "scalar wrong");
    t = nvfp4moe_st_file_find(f, "d.scale");
    CHECK(t && t->dtype == NVFP4MOE_ST_F8_E4M3 && !memcmp(t->data, e4m3, 32), "e4m3 wrong");
    t = nvfp4moe_st_file_find(f, "e.empty");
    CHECK(t && t->numel == 0 && t->nbytes == 0, "zero-size tensor wrong");
    t = nvfp4moe_st_file_find(f, "f.fp4");
    CHECK(t && t->nbytes == 2 && !memcmp(t->data, f4, 2), "F4 tensor wrong");
    CHECK(nvfp4moe_st_file_find(f, "nope") == NULL, "found a missing tensor");
    const char *md = nvfp4moe_st_file_metadata(f, "format");
    CHECK(md && !strcmp(md, "pt"), "metadata %s", md ? md : "(null)");
    // Data order: offsets ascending.
    for (size_t i = 1; i < nvfp4moe_st_file_count(f); i++)
        CHECK(nvfp4moe_st_file_tensor(f, i - 1)->offset <= nvfp4moe_st_file_tensor(f, i)->offset,
              "tensor %zu out of order", i);
    nvfp4moe_st_close(f);
}

static void test_dtypes(void) {
    T_CASE("dtype names");
    nvfp4moe_st_dtype d;
    const char *names[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL",
                           "F8_E4M3", "F8_E5M2", "U16", "U32", "U64", "F4", "F8_E8M0"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        CHECK_OK(nvfp4moe_st_dtype_parse(names[i], &d));
        CHECK(!strcmp(nvfp4moe_st_dtype_name(d), names[i]), "%s round trip", names[i]);
    }
    CHECK_ERR(nvfp4moe_st_dtype_parse("f32", &d), NVFP4MOE_ERR_NOT_FOUND, "unknown");
    CHECK(nvfp4moe_st_dtype_bits(NVFP4MOE_ST_F4) == 4 && nvfp4moe_st_dtype_bits(NVFP4MOE_ST_BF16) == 16,
          "bits");
}

static void test_broken(void) {
    // Each file is a valid one with one thing wrong; each message says which.
    const char *ok1 = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";

    FILE *fp = fopen(path_in("empty.safetensors"), "wb");
    fclose(fp);
    expect_broken("empty file", path_in("empty.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "too short for the 8-byte header length");

    fp = fopen(path_in("short.safetensors"), "wb");
    fwrite("\x10\x00\x00", 1, 3, fp);
    fclose(fp);
    expect_broken("truncated in the header length", path_in("short.safetensors"),
                  NVFP4MOE_ERR_FORMAT, "too short");

    write_raw(path_in("zero_hlen.safetensors"), 0, "", 0);
    expect_broken("zero header length", path_in("zero_hlen.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "does not start with '{'");

    write_hdr(path_in("trunc_data.safetensors"), ok1, 10);
    expect_broken("truncated data", path_in("trunc_data.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "run past the end of the data section (10 bytes; truncated file?)");

    write_raw(path_in("huge_hlen.safetensors"), 1ull << 60, ok1, 24);
    expect_broken("header length over the cap", path_in("huge_hlen.safetensors"),
                  NVFP4MOE_ERR_FORMAT, "exceeds the 100000000-byte limit");

    write_raw(path_in("lying_hlen.safetensors"), strlen(ok1) + 100, ok1, 24);
    expect_broken("header length past EOF", path_in("lying_hlen.safetensors"),
                  NVFP4MOE_ERR_FORMAT, "runs past the end of the");

    write_raw(path_in("short_hlen.safetensors"), strlen(ok1) - 5, ok1, 24);
    expect_broken("header length too small", path_in("short_hlen.safetensors"),
                  NVFP4MOE_ERR_FORMAT, "header is not valid JSON");

    write_hdr(path_in("not_brace.safetensors"), " {\"a\":1}", 0);
    expect_broken("header not starting with {", path_in("not_brace.safetensors"),
                  NVFP4MOE_ERR_FORMAT, "does not start with '{'");

    write_hdr(path_in("bad_json.safetensors"), "{\"t\":{\"dtype\":\"F32\",,}}", 0);
    expect_broken("bad JSON", path_in("bad_json.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "header is not valid JSON");

    write_hdr(path_in("dup.safetensors"),
              "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
              "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
              2);
    expect_broken("duplicate tensor names", path_in("dup.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "duplicate");

    write_hdr(path_in("entry.safetensors"), "{\"t\":5}", 0);
    expect_broken("entry not an object", path_in("entry.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "tensor 't': header entry is not a JSON object");

    write_hdr(path_in("nodtype.safetensors"), "{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    expect_broken("missing dtype", path_in("nodtype.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "tensor 't': missing or non-string \"dtype\"");

    write_hdr(path_in("dtype.safetensors"),
              "{\"w\":{\"dtype\":\"F7\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24);
    expect_broken("wrong dtype", path_in("dtype.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "tensor 'w': unknown dtype 'F7'");

    write_hdr(path_in("mismatch.safetensors"),
              "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20);
    expect_broken("shape/byte mismatch", path_in("mismatch.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "tensor 'w': shape and dtype F32 need 24 bytes but data_offsets [0, 20] span 20");

    write_hdr(path_in("overlap.safetensors"),
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
              12);
    expect_broken("overlapping offsets", path_in("overlap.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "tensor 'b': data_offsets [4, 12] overlap tensor 'a'");

    write_hdr(path_in("hole.safetensors"),
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}",
              12);
    expect_broken("hole between tensors", path_in("hole.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "tensor 'b': hole of 4 bytes before it");

    write_hdr(path_in("lead_hole.safetensors"),
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6);
    expect_broken("hole at the start", path_in("lead_hole.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "tensor 'a': hole of 2 bytes");

    write_hdr(path_in("trailing.safetensors"), ok1, 30);
    expect_broken("uncovered trailing bytes", path_in("trailing.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "6 bytes after the last tensor are not covered");

    write_hdr(path_in("past_eof.safetensors"),
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"U8\",\"shape\":[1000000],\"data_offsets\":[4,1000004]}}",
              4);
    expect_broken("offsets past EOF", path_in("past_eof.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "tensor 'b': data_offsets [4, 1000004] run past the end");

    write_hdr(path_in("absurd.safetensors"),
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
              "\"data_offsets\":[0,4]}}",
              4);
    expect_broken("absurd shape (overflow)", path_in("absurd.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "tensor 'a': absurd shape");

    write_hdr(path_in("absurd2.safetensors"),
              "{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}",
              4);
    expect_broken("absurd shape (byte size)", path_in("absurd2.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "byte size overflows");

    write_hdr(path_in("dims.safetensors"),
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1);
    expect_broken("too many dimensions", path_in("dims.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "9 dimensions, more than 8");

    write_hdr(path_in("negdim.safetensors"),
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1);
    expect_broken("negative dimension", path_in("negdim.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "shape[0] is not a non-negative integer");

    write_hdr(path_in("backwards.safetensors"),
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4);
    expect_broken("end before begin", path_in("backwards.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "end before they begin");

    write_hdr(path_in("offs.safetensors"),
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1);
    expect_broken("data_offsets arity", path_in("offs.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "must be an array [begin, end]");

    write_hdr(path_in("f4odd.safetensors"),
              "{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2);
    expect_broken("F4 not whole bytes", path_in("f4odd.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "are not whole bytes");

    write_hdr(path_in("meta.safetensors"), "{\"__metadata__\":{\"format\":3}}", 0);
    expect_broken("metadata not strings", path_in("meta.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "\"__metadata__\" value of 'format' is not a string");

    write_hdr(path_in("emptyname.safetensors"),
              "{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    expect_broken("empty tensor name", path_in("emptyname.safetensors"), NVFP4MOE_ERR_FORMAT,
                  "empty name");

    expect_broken("missing file", path_in("does-not-exist.safetensors"), NVFP4MOE_ERR_NOT_FOUND,
                  "cannot open");

    // Allowed corner cases: an empty header object with no data, metadata only, zero-size tensor.
    T_CASE("valid corner cases");
    nvfp4moe_st_file *f = NULL;
    write_hdr(path_in("empty_obj.safetensors"), "{}      ", 0);
    CHECK_OK(nvfp4moe_st_open(path_in("empty_obj.safetensors"), &f));
    CHECK(f && nvfp4moe_st_file_count(f) == 0, "empty header");
    nvfp4moe_st_close(f);
    f = NULL;
    write_hdr(path_in("zero.safetensors"),
              "{\"z\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
              "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
              "\"__metadata__\":{\"k\":\"v\"}}",
              2);
    CHECK_OK(nvfp4moe_st_open(path_in("zero.safetensors"), &f));
    CHECK(f && nvfp4moe_st_file_count(f) == 2, "zero-size tensor file");
    nvfp4moe_st_close(f);
}

/* Two shards and an index; then what goes wrong with indexes. */
static void test_shards(void) {
    T_CASE("multi-shard model");
    char sub[512];
    snprintf(sub, sizeof sub, "%s/sharded", g_dir);
    mkdir(sub, 0755);
    char p1[600], p2[600], idx[600];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", sub);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", sub);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", sub);
    uint8_t buf[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    int64_t s4[1] = {4};
    nvfp4moe_st_writer *w;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    CHECK_OK(nvfp4moe_st_writer_add(w, "x.a", NVFP4MOE_ST_U8, 1, s4, buf));
    CHECK_OK(nvfp4moe_st_writer_add(w, "x.b", NVFP4MOE_ST_U8, 1, s4, buf + 4));
    CHECK_OK(nvfp4moe_st_writer_save(w, p1));
    nvfp4moe_st_writer_free(w);
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    CHECK_OK(nvfp4moe_st_writer_add(w, "y.c", NVFP4MOE_ST_U8, 1, s4, buf + 8));
    CHECK_OK(nvfp4moe_st_writer_save(w, p2));
    nvfp4moe_st_writer_free(w);
    FILE *f = fopen(idx, "w");
    fprintf(f, "{\"metadata\":{\"total_size\":12},\"weight_map\":{"
               "\"x.a\":\"model-00001-of-00002.safetensors\","
               "\"x.b\":\"model-00001-of-00002.safetensors\","
               "\"y.c\":\"model-00002-of-00002.safetensors\"}}");
    fclose(f);
    nvfp4moe_st_model *m = NULL;
    CHECK_OK(nvfp4moe_st_model_open(sub, &m));
    if (m) {
        CHECK(nvfp4moe_st_model_num_files(m) == 2 && nvfp4moe_st_model_count(m) == 3,
              "files %zu tensors %zu", nvfp4moe_st_model_num_files(m), nvfp4moe_st_model_count(m));
        const nvfp4moe_st_tensor *t = nvfp4moe_st_model_find(m, "y.c");
        CHECK(t && !memcmp(t->data, buf + 8, 4) && strstr(t->file, "00002"), "y.c");
        t = nvfp4moe_st_model_find(m, "x.b");
        CHECK(t && !memcmp(t->data, buf + 4, 4), "x.b");
        size_t lb = nvfp4moe_st_model_lower_bound(m, "x.");
        CHECK(lb == 0 && !strcmp(nvfp4moe_st_model_tensor(m, 1)->name, "x.b"), "lower bound");
        CHECK(nvfp4moe_st_model_lower_bound(m, "z") == 3, "lower bound past the end");
    }
    nvfp4moe_st_model_close(m);

    T_CASE("index maps a tensor to the wrong shard");
    f = fopen(idx, "w");
    fprintf(f, "{\"weight_map\":{\"x.a\":\"model-00002-of-00002.safetensors\"}}");
    fclose(f);
    m = NULL;
    CHECK_ERR(nvfp4moe_st_model_open(sub, &m), NVFP4MOE_ERR_NOT_FOUND,
              "tensor 'x.a' is mapped to shard 'model-00002-of-00002.safetensors', which does not "
              "contain it");
    CHECK(m == NULL, "output written on failure");

    T_CASE("index names a missing shard");
    f = fopen(idx, "w");
    fprintf(f, "{\"weight_map\":{\"x.a\":\"model-00009-of-00009.safetensors\"}}");
    fclose(f);
    CHECK_ERR(nvfp4moe_st_model_open(sub, &m), NVFP4MOE_ERR_NOT_FOUND,
              "names shard 'model-00009-of-00009.safetensors'");

    T_CASE("index escapes the directory");
    f = fopen(idx, "w");
    fprintf(f, "{\"weight_map\":{\"x.a\":\"../rt.safetensors\"}}");
    fclose(f);
    CHECK_ERR(nvfp4moe_st_model_open(sub, &m), NVFP4MOE_ERR_FORMAT, "leaves the model directory");

    T_CASE("index without weight_map");
    f = fopen(idx, "w");
    fprintf(f, "{\"metadata\":{}}");
    fclose(f);
    CHECK_ERR(nvfp4moe_st_model_open(sub, &m), NVFP4MOE_ERR_FORMAT, "\"weight_map\"");

    T_CASE("broken shard through the index");
    f = fopen(idx, "w");
    fprintf(f, "{\"weight_map\":{\"x.a\":\"bad.safetensors\"}}");
    fclose(f);
    char bad[600];
    snprintf(bad, sizeof bad, "%s/bad.safetensors", sub);
    write_raw(bad, 1ull << 40, "{}", 0);
    CHECK_ERR(nvfp4moe_st_model_open(sub, &m), NVFP4MOE_ERR_FORMAT, "exceeds the");

    T_CASE("no index: every *.safetensors, and a name in two of them");
    remove(idx);
    remove(bad);
    CHECK_OK(nvfp4moe_st_model_open(sub, &m));
    CHECK(m && nvfp4moe_st_model_count(m) == 3, "glob open");
    nvfp4moe_st_model_close(m);
    m = NULL;
    CHECK_OK(nvfp4moe_st_writer_create(&w));
    CHECK_OK(nvfp4moe_st_writer_add(w, "x.a", NVFP4MOE_ST_U8, 1, s4, buf));
    snprintf(bad, sizeof bad, "%s/extra.safetensors", sub);
    CHECK_OK(nvfp4moe_st_writer_save(w, bad));
    nvfp4moe_st_writer_free(w);
    CHECK_ERR(nvfp4moe_st_model_open(sub, &m), NVFP4MOE_ERR_FORMAT, "tensor 'x.a' is in both");

    T_CASE("directory without safetensors");
    char none[600];
    snprintf(none, sizeof none, "%s/none", g_dir);
    mkdir(none, 0755);
    CHECK_ERR(nvfp4moe_st_model_open(none, &m), NVFP4MOE_ERR_NOT_FOUND, "no model.safetensors");

    T_CASE("a single file as a model");
    CHECK_OK(nvfp4moe_st_model_open(p2, &m));
    CHECK(m && nvfp4moe_st_model_count(m) == 1, "single file");
    nvfp4moe_st_model_close(m);
}


/* Random damage to a valid file: every outcome must be OK or a FORMAT error naming the file, and
 * an OK file's tensors must lie inside it (ASan checks the reads in tests/sanitize.sh). */
static void test_mutations(void) {
    T_CASE("random mutations");
    const char *src = path_in("rt.safetensors");
    FILE *fp = fopen(src, "rb");
    CHECK(fp != NULL, "no round-trip file");
    if (!fp) return;
    uint8_t orig[4096];
    size_t n = fread(orig, 1, sizeof orig, fp);
    fclose(fp);
    uint64_t st = 12345;
    int ok = 0, bad = 0, wrong = 0;
    const char *mp = path_in("mut.safetensors");
    for (int iter = 0; iter < 3000; iter++) {
        uint8_t buf[4096];
        memcpy(buf, orig, n);
        size_t len = n;
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        int kind = (int)((st >> 33) % 4);
        int edits = 1 + (int)((st >> 40) % 4);
        for (int e = 0; e < edits && len > 24; e++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)((st >> 20) % len);
            uint8_t v = (uint8_t)(st >> 50);
            if (kind == 0) buf[at] ^= (uint8_t)(1u << (v & 7));          // bit flip anywhere
            else if (kind == 1) buf[at % 24] = v;                        // header length / start
            else if (kind == 2) {                                        // a digit in the JSON
                size_t j = 8 + at % (len - 8);
                while (j < len && (buf[j] < '0' || buf[j] > '9')) j++;
                if (j < len) buf[j] = (uint8_t)('0' + v % 10);
            } else len = at;                                             // truncation
        }
        FILE *out = fopen(mp, "wb");
        fwrite(buf, 1, len, out);
        fclose(out);
        nvfp4moe_st_file *f = NULL;
        nvfp4moe_status s = nvfp4moe_st_open(mp, &f);
        if (s == NVFP4MOE_OK) {
            ok++;
            unsigned sum = 0;
            for (size_t i = 0; i < nvfp4moe_st_file_count(f); i++) {
                const nvfp4moe_st_tensor *t = nvfp4moe_st_file_tensor(f, i);
                for (uint64_t b = 0; b < t->nbytes; b++) sum += ((const uint8_t *)t->data)[b];
            }
            (void)sum;
            nvfp4moe_st_close(f);
        } else if (s == NVFP4MOE_ERR_FORMAT && strstr(nvfp4moe_last_error(), mp)) {
            bad++;
        } else {
            wrong++;
            if (wrong < 5) fprintf(stderr, "  mutation %d: %s: %s\n", iter, nvfp4moe_status_str(s), nvfp4moe_last_error());
        }
    }
    CHECK(wrong == 0, "%d mutations gave an unexpected status", wrong);
    CHECK(bad > 2000, "only %d of 3000 mutations were rejected", bad);
    printf("mutations: %d still valid, %d rejected\n", ok, bad);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nvfp4moe-st-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_dtypes();
    test_round_trip();
    test_broken();
    test_mutations();
    test_shards();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return t_finish("test_safetensors");
}
