/* Tests for io/formats/safetensors: round trips, the exact bytes the reference
 * writer produces, every validation rule, truncations, a replay of the fuzz
 * corpus with mutations, and interop with PyTorch (tests/golden). */
#include "config.h"

#include "tests/harness.h"

#include "io/formats/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "tests/fuzz/fuzz.h"

/* A file in memory from a header text (padded by the caller or not) and data. */
static unsigned char *make_file(const char *header, const void *data, size_t dlen, size_t *size)
{
    size_t h = strlen(header);
    unsigned char *b = malloc(8 + h + dlen + 1);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    if (dlen) memcpy(b + 8 + h, data, dlen);
    *size = 8 + h + dlen;
    return b;
}

static char tmpdir[512];

static const char *tmp_path(const char *name)
{
    static char buf[1024];
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "%s/tests/tmp-safetensors-%d", ch_test_builddir(), (int)getpid());
        mkdir(tmpdir, 0755);
    }
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

/* ---------------------------------------------------------------- writer */

static void test_reference_bytes(void **state)
{
    /* The outputs of safetensors' own serializer tests (Rust crate,
     * tensor.rs: test_serialization, test_serialization_forced_alignement,
     * test_empty), byte for byte. */
    float v[6] = {0, 1, 2, 3, 4, 5};
    ch_st_view_t a = {.name = "attn.0", .dtype = CH_ST_F32, .ndim = 3, .shape = {1, 2, 3},
                      .data = v, .nbytes = sizeof v};
    ch_st_view_t b = {.name = "attn0", .dtype = CH_ST_F32, .ndim = 4, .shape = {1, 1, 2, 3},
                      .data = v, .nbytes = sizeof v};
    ch_st_meta_t fw = {"framework", "pt"};
    void *out;
    size_t size;
    const char *h1 = "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
    const char *h2 = "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       ";
    const char *h3 = "{}      ";
    const char *h4 = "{\"__metadata__\":{\"framework\":\"pt\"}}     ";

    assert_ch_ok(ch_safetensors_serialize(&a, 1, NULL, 0, &out, &size));
    assert_int_equal(size, 8 + 64 + 24);
    assert_int_equal(((unsigned char *)out)[0], 64);
    assert_memory_equal((char *)out + 8, h1, 64);
    assert_memory_equal((char *)out + 72, v, 24);
    free(out);

    assert_ch_ok(ch_safetensors_serialize(&b, 1, NULL, 0, &out, &size));
    assert_int_equal(size, 8 + 72 + 24);
    assert_int_equal(((unsigned char *)out)[0], 72);
    assert_memory_equal((char *)out + 8, h2, 72);
    free(out);

    assert_ch_ok(ch_safetensors_serialize(NULL, 0, NULL, 0, &out, &size));
    assert_int_equal(size, 16);
    assert_int_equal(((unsigned char *)out)[0], 8);
    assert_memory_equal((char *)out + 8, h3, 8);
    free(out);

    assert_ch_ok(ch_safetensors_serialize(NULL, 0, &fw, 1, &out, &size));
    assert_int_equal(size, 48);
    assert_int_equal(((unsigned char *)out)[0], 40);
    assert_memory_equal((char *)out + 8, h4, 40);
    free(out);
}

/* A small state dict: conv weight, BN buffers incl. a 0-dim int64, an
 * empty tensor, and a float count that puts the I64 at an offset that is not
 * a multiple of 8 (legal: the format has no per-tensor alignment). */
static float w[2 * 1 * 3 * 3], rm[3];
static int64_t nbt = 7, big = -5;
static ch_st_view_t sd[5];

static void make_state(void)
{
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) w[i] = (float)i * 0.25f - 1.0f;
    rm[0] = 1e-30f;
    rm[1] = -0.0f;
    rm[2] = INFINITY;
    sd[0] = (ch_st_view_t){.name = "conv1.weight", .dtype = CH_ST_F32, .ndim = 4,
                           .shape = {2, 1, 3, 3}, .data = w, .nbytes = sizeof w};
    sd[1] = (ch_st_view_t){.name = "bn1.running_mean", .dtype = CH_ST_F32, .ndim = 1,
                           .shape = {3}, .data = rm, .nbytes = sizeof rm};
    sd[2] = (ch_st_view_t){.name = "bn1.num_batches_tracked", .dtype = CH_ST_I64, .ndim = 0,
                           .data = &nbt, .nbytes = 8};
    sd[3] = (ch_st_view_t){.name = "empty", .dtype = CH_ST_F32, .ndim = 2, .shape = {0, 5},
                           .data = NULL, .nbytes = 0};
    sd[4] = (ch_st_view_t){.name = "z.\xc3\xa9t\xc3\xa9", .dtype = CH_ST_I64, .ndim = 1,
                           .shape = {1}, .data = &big, .nbytes = 8};
}

static void check_state(const ch_safetensors_t *st)
{
    assert_int_equal(ch_safetensors_count(st), 5);
    for (size_t i = 0; i < 5; i++) {
        const ch_st_view_t *v = ch_safetensors_at(st, i);
        assert_non_null(v);
        assert_string_equal(v->name, sd[i].name); /* file order = written order */
        assert_int_equal(v->dtype, sd[i].dtype);
        assert_int_equal(v->ndim, sd[i].ndim);
        for (int d = 0; d < v->ndim; d++) assert_int_equal(v->shape[d], sd[i].shape[d]);
        assert_int_equal(v->nbytes, sd[i].nbytes);
        if (v->nbytes) assert_memory_equal(v->data, sd[i].data, v->nbytes);
        assert_ptr_equal(ch_safetensors_find(st, sd[i].name), v);
    }
    assert_null(ch_safetensors_at(st, 5));
    assert_null(ch_safetensors_find(st, "missing"));
    assert_null(ch_safetensors_find(st, "bn1"));
    assert_string_equal(ch_safetensors_meta_get(st, "epoch"), "3");
    assert_string_equal(ch_safetensors_meta_get(st, "note"), "a \"quoted\"\nline \xe2\x82\xac");
    assert_null(ch_safetensors_meta_get(st, "nope"));
    assert_int_equal(ch_safetensors_meta_count(st), 2);
    assert_string_equal(ch_safetensors_meta_at(st, 0)->key, "epoch");
}

static const ch_st_meta_t meta2[2] = {{"epoch", "3"}, {"note", "a \"quoted\"\nline \xe2\x82\xac"}};

static void test_roundtrip_memory_and_file(void **state)
{
    void *buf;
    size_t size;
    ch_safetensors_t *st;
    const char *path = tmp_path("rt.safetensors");
    make_state();

    assert_ch_ok(ch_safetensors_serialize(sd, 5, meta2, 2, &buf, &size));
    assert_int_equal((8 + (size_t)((unsigned char *)buf)[0] + ((size_t)((unsigned char *)buf)[1] << 8)) % 8, 0);
    assert_ch_ok(ch_safetensors_from_memory(buf, size, "rt", 0, &st));
    check_state(st);
    ch_safetensors_destroy(st);
    assert_ch_ok(ch_safetensors_from_memory(buf, size, "rt", 1, &st));
    memset(buf, 0, size); /* copy=1: independent of buf */
    check_state(st);
    ch_safetensors_destroy(st);
    free(buf);

    assert_ch_ok(ch_safetensors_write(path, sd, 5, meta2, 2));
    /* the read() path (used where mmap fails) */
    setenv("COHORT_SAFETENSORS_NO_MMAP", "1", 1);
    assert_ch_ok(ch_safetensors_open(path, &st));
    unsetenv("COHORT_SAFETENSORS_NO_MMAP");
    check_state(st);
    ch_safetensors_destroy(st);
    /* the mmap path (default) */
    assert_ch_ok(ch_safetensors_open(path, &st));
    assert_string_equal(ch_safetensors_source(st), path);
    check_state(st);

    /* read_into: aligned copy and its checks */
    {
        int64_t got = 0, shape1[1] = {1}, shape3[1] = {3};
        float m[3];
        assert_ch_ok(ch_safetensors_read_into(st, "bn1.num_batches_tracked", CH_ST_I64, 0, NULL, &got, 8));
        assert_int_equal(got, 7);
        assert_ch_ok(ch_safetensors_read_into(st, "z.\xc3\xa9t\xc3\xa9", CH_ST_I64, 1, shape1, &got, 8));
        assert_int_equal(got, -5);
        assert_ch_ok(ch_safetensors_read_into(st, "bn1.running_mean", CH_ST_F32, 1, shape3, m, sizeof m));
        assert_memory_equal(m, rm, sizeof m);
        assert_ch_error(ch_safetensors_read_into(st, "bn1.running_mean", CH_ST_I64, 1, shape3, m, sizeof m),
                        CH_ERR_INVALID, "has dtype F32, expected I64");
        assert_ch_error(ch_safetensors_read_into(st, "bn1.running_mean", CH_ST_F32, 1, shape1, m, 4),
                        CH_ERR_INVALID, "'bn1.running_mean' has shape (3), expected (1)");
        assert_ch_error(ch_safetensors_read_into(st, "fc.weight", CH_ST_F32, 1, shape1, m, 4),
                        CH_ERR_INVALID, "no tensor named 'fc.weight'");
        assert_non_null(strstr(ch_error_message(), path));
    }
    ch_safetensors_destroy(st);

    /* Overwrite with fewer tensors: the file is replaced, no temporaries left. */
    assert_ch_ok(ch_safetensors_write(path, sd, 1, NULL, 0));
    assert_ch_ok(ch_safetensors_open(path, &st));
    assert_int_equal(ch_safetensors_count(st), 1);
    assert_int_equal(ch_safetensors_meta_count(st), 0);
    ch_safetensors_destroy(st);
    {
        DIR *d = opendir(tmpdir);
        struct dirent *e;
        int others = 0;
        assert_non_null(d);
        while ((e = readdir(d)))
            if (strstr(e->d_name, ".tmp.")) others++;
        closedir(d);
        assert_int_equal(others, 0);
    }
    unlink(path);
}

static void test_writer_rejects(void **state)
{
    ch_st_view_t v[2];
    void *buf;
    size_t size;
    float f[4] = {0};
    ch_st_meta_t dup[2] = {{"k", "1"}, {"k", "2"}};
    ch_st_meta_t badutf[1] = {{"k", "\xff"}};
    v[0] = (ch_st_view_t){.name = "a", .dtype = CH_ST_F32, .ndim = 1, .shape = {4}, .data = f, .nbytes = 16};
    v[1] = v[0];
    assert_ch_error(ch_safetensors_serialize(v, 2, NULL, 0, &buf, &size), CH_ERR_INVALID, "'a' given twice");
    v[1].name = "__metadata__";
    assert_ch_error(ch_safetensors_serialize(v, 2, NULL, 0, &buf, &size), CH_ERR_INVALID, "__metadata__");
    v[1].name = "";
    assert_ch_error(ch_safetensors_serialize(v, 2, NULL, 0, &buf, &size), CH_ERR_INVALID, "empty name");
    v[1].name = "b\xc3";
    assert_ch_error(ch_safetensors_serialize(v, 2, NULL, 0, &buf, &size), CH_ERR_INVALID, "UTF-8");
    v[1].name = "b";
    v[1].nbytes = 12;
    assert_ch_error(ch_safetensors_serialize(v, 2, NULL, 0, &buf, &size), CH_ERR_INVALID,
                    "'b': shape and dtype F32 need 16 bytes, view has 12");
    v[1].nbytes = 16;
    v[1].ndim = 9;
    assert_ch_error(ch_safetensors_serialize(v, 2, NULL, 0, &buf, &size), CH_ERR_INVALID, "ndim 9");
    v[1].ndim = 1;
    v[1].shape[0] = -4;
    assert_ch_error(ch_safetensors_serialize(v, 2, NULL, 0, &buf, &size), CH_ERR_INVALID, "shape[0] = -4");
    v[1].shape[0] = 4;
    v[1].dtype = (ch_st_dtype_t)7;
    assert_ch_error(ch_safetensors_serialize(v, 2, NULL, 0, &buf, &size), CH_ERR_INVALID, "invalid dtype 7");
    v[1].dtype = CH_ST_F32;
    v[1].data = NULL;
    assert_ch_error(ch_safetensors_serialize(v, 2, NULL, 0, &buf, &size), CH_ERR_INVALID, "NULL data");
    v[1].data = f;
    assert_ch_error(ch_safetensors_serialize(v, 2, dup, 2, &buf, &size), CH_ERR_INVALID, "key 'k' given twice");
    assert_ch_error(ch_safetensors_serialize(v, 2, badutf, 1, &buf, &size), CH_ERR_INVALID, "UTF-8");
    assert_ch_ok(ch_safetensors_serialize(v, 2, dup, 1, &buf, &size));
    free(buf);
    /* An unwritable destination names the path. */
    assert_ch_error(ch_safetensors_write("/nonexistent-dir/x/model.safetensors", v, 2, NULL, 0),
                    CH_ERR_IO, "/nonexistent-dir/x/model.safetensors");
    /* A failed write leaves the old file. */
    {
        const char *p = tmp_path("keep.safetensors");
        ch_safetensors_t *st;
        assert_ch_ok(ch_safetensors_write(p, v, 1, NULL, 0));
        v[1].nbytes = 3;
        assert_ch_error(ch_safetensors_write(p, v, 2, NULL, 0), CH_ERR_INVALID, p);
        v[1].nbytes = 16;
        assert_ch_ok(ch_safetensors_open(p, &st));
        assert_int_equal(ch_safetensors_count(st), 1);
        ch_safetensors_destroy(st);
        unlink(p);
    }
}

/* ---------------------------------------------------------------- reader */

typedef struct {
    const char *header; /* written as is (no padding added) */
    size_t dlen;        /* data bytes after it (zeros) */
    ch_status code;
    const char *needle;
} bad_case_t;

static const bad_case_t bad_cases[] = {
    {"[]", 0, CH_ERR_FORMAT, "header is an array, expected a JSON object"},
    {"{\"a\":", 0, CH_ERR_FORMAT, "header is not valid JSON"},
    {"{} x", 0, CH_ERR_FORMAT, "header is not valid JSON"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, CH_ERR_FORMAT, "duplicate"},
    {"{\"a\":5}", 0, CH_ERR_FORMAT, "tensor 'a': entry is an integer, expected an object"},
    {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CH_ERR_FORMAT, "tensor 'a': missing \"dtype\""},
    {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, CH_ERR_FORMAT, "tensor 'a': missing \"shape\""},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, CH_ERR_FORMAT, "tensor 'a': missing \"data_offsets\""},
    {"{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CH_ERR_FORMAT, "\"dtype\" is an integer"},
    {"{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, CH_ERR_UNSUPPORTED,
     "tensor 'w' has dtype F16; cohort reads only F32 and I64"},
    {"{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, CH_ERR_UNSUPPORTED, "'w' has dtype BF16"},
    {"{\"w\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, CH_ERR_FORMAT, "unknown dtype 'Q7'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16, CH_ERR_FORMAT, "\"shape\" is an integer, expected an array"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, CH_ERR_FORMAT, "shape[0] is a negative integer"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, CH_ERR_FORMAT, "shape[0] is a non-integer number"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,\"2\"],\"data_offsets\":[0,8]}}", 8, CH_ERR_FORMAT, "shape[1] is a string"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, CH_ERR_UNSUPPORTED, "9 dimensions"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, CH_ERR_FORMAT, "overflows"},
    {"{\"a\":{\"dtype\":\"I64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}", 4, CH_ERR_FORMAT, "overflows"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4, CH_ERR_FORMAT, "not valid JSON"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, CH_ERR_FORMAT, "array of two non-negative integers"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, CH_ERR_FORMAT, "array of two"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{\"0\":4}}}", 4, CH_ERR_FORMAT, "array of two"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, CH_ERR_FORMAT, "array of two"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, CH_ERR_FORMAT, "begin > end"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, CH_ERR_FORMAT,
     "tensor 'a': shape and dtype F32 give 8 bytes but data_offsets [0, 4] hold 4"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, CH_ERR_FORMAT, "run past the end of the 4-byte data area"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, CH_ERR_FORMAT, "overlaps tensor 'a'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, CH_ERR_FORMAT, "overlaps"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, CH_ERR_FORMAT, "4 unused bytes before tensor 'a'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12, CH_ERR_FORMAT, "tensors cover 4 bytes but the data area after the header holds 12"},
    {"{}", 1, CH_ERR_FORMAT, "tensors cover 0 bytes"},
    {"{\"__metadata__\":[1]}", 0, CH_ERR_FORMAT, "\"__metadata__\" is an array, expected an object"},
    {"{\"__metadata__\":{\"epoch\":3}}", 0, CH_ERR_FORMAT, "\"__metadata__\" entry 'epoch' is an integer, expected a string"},
    {"{\"a\xff\":1}", 0, CH_ERR_FORMAT, "not valid JSON"},
    {"{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CH_ERR_FORMAT, "not valid JSON"},
};

static void test_reader_rejects(void **state)
{
    unsigned char *b;
    size_t size;
    ch_safetensors_t *st = NULL;
    char zeros[64] = {0};

    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case_t *c = &bad_cases[i];
        ch_status s;
        b = make_file(c->header, zeros, c->dlen, &size);
        ch_error_clear();
        s = ch_safetensors_from_memory(b, size, "bad.safetensors", 0, &st);
        if (s != c->code || !strstr(ch_error_message(), c->needle) ||
            !strstr(ch_error_message(), "bad.safetensors"))
            fail_msg("case %zu (%s): got %s '%s', expected %s containing '%s'", i, c->header,
                     ch_status_name(s), ch_error_message(), ch_status_name(c->code), c->needle);
        assert_null(st);
        free(b);
    }
    /* Header length field problems. */
    {
        unsigned char h[16] = {0};
        h[0] = 1;
        assert_ch_error(ch_safetensors_from_memory(h, 5, "x", 0, &st), CH_ERR_FORMAT, "x: 5 bytes, too short");
        assert_ch_error(ch_safetensors_from_memory(h, 9, "x", 0, &st), CH_ERR_FORMAT, "header length 1 is too small");
        h[0] = 9;
        assert_ch_error(ch_safetensors_from_memory(h, 16, "x", 0, &st), CH_ERR_FORMAT,
                        "header length 9 exceeds the 8 bytes after the length field");
        h[0] = 0;
        h[7] = 0x80;
        assert_ch_error(ch_safetensors_from_memory(h, 16, "x", 0, &st), CH_ERR_FORMAT, "exceeds the limit");
        h[7] = 0;
        h[3] = 0x10; /* 268 MB: above the limit even if the file were that big */
        assert_ch_error(ch_safetensors_from_memory(h, 16, "x", 0, &st), CH_ERR_FORMAT, "exceeds the limit");
    }
    /* Files: missing, a directory, truncated on disk. */
    assert_ch_error(ch_safetensors_open("/nonexistent/model.safetensors", &st), CH_ERR_IO,
                    "cannot open '/nonexistent/model.safetensors': No such file or directory");
    assert_ch_error(ch_safetensors_open(tmpdir[0] ? tmpdir : ".", &st), CH_ERR_IO, "not a regular file");
    {
        void *buf;
        const char *p = tmp_path("trunc.safetensors");
        FILE *f;
        make_state();
        assert_ch_ok(ch_safetensors_serialize(sd, 5, meta2, 2, &buf, &size));
        f = fopen(p, "wb");
        assert_non_null(f);
        fwrite(buf, 1, size - 3, f);
        fclose(f);
        assert_ch_error(ch_safetensors_open(p, &st), CH_ERR_FORMAT, "truncated file?");
        assert_non_null(strstr(ch_error_message(), p));
        setenv("COHORT_SAFETENSORS_NO_MMAP", "1", 1);
        assert_ch_error(ch_safetensors_open(p, &st), CH_ERR_FORMAT, "truncated file?");
        unsetenv("COHORT_SAFETENSORS_NO_MMAP");
        f = fopen(p, "wb");
        fwrite(buf, 1, 20, f);
        fclose(f);
        assert_ch_error(ch_safetensors_open(p, &st), CH_ERR_FORMAT, "exceeds the 12 bytes after the length field");
        unlink(p);
        free(buf);
    }
}

/* Every truncation of a valid file is an error, never a crash; the full
 * file loads. */
static void test_every_truncation(void **state)
{
    void *buf;
    size_t size;
    ch_safetensors_t *st;
    make_state();
    assert_ch_ok(ch_safetensors_serialize(sd, 5, meta2, 2, &buf, &size));
    for (size_t n = 0; n < size; n++) {
        void *copy = malloc(n ? n : 1); /* exact-size heap block: ASan sees overreads */
        memcpy(copy, buf, n);
        ch_error_clear();
        if (ch_safetensors_from_memory(copy, n, "cut", 0, &st) == CH_OK)
            fail_msg("truncation to %zu of %zu bytes loaded", n, size);
        assert_true(ch_error_message()[0] != 0);
        free(copy);
    }
    assert_ch_ok(ch_safetensors_from_memory(buf, size, "whole", 0, &st));
    ch_safetensors_destroy(st);
    free(buf);
}

/* ---------------------------------------------------------------- fuzz replay */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static unsigned char *read_all(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    unsigned char *b;
    long n;
    *size = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = malloc(n > 0 ? (size_t)n : 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return b;
}

/* Replays tests/fuzz/corpus/safetensors through the fuzz target, then
 * deterministic mutations of each file (byte flips, digit/quote/brace
 * insertions, truncations): a short in-process fuzz run for make check. */
static void test_fuzz_corpus_replay(void **state)
{
    char dir[1024];
    DIR *d;
    struct dirent *e;
    int files = 0, loaded = 0;
    static const char inject[] = "0123456789{}[],:\"-. e\xff";

    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/safetensors", ch_test_srcdir());
    d = opendir(dir);
    if (!d) fail_msg("cannot open corpus %s: %s", dir, strerror(errno));
    while ((e = readdir(d))) {
        char path[2048];
        size_t size = 0;
        unsigned char *b;
        ch_safetensors_t *st;
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        b = read_all(path, &size);
        assert_non_null(b);
        files++;
        LLVMFuzzerTestOneInput(b, size);
        if (ch_safetensors_from_memory(b, size, e->d_name, 0, &st) == CH_OK) {
            loaded++;
            ch_safetensors_destroy(st);
        }
        for (int m = 0; m < 400; m++) {
            size_t n = size + 1;
            unsigned char *mut = malloc(n);
            int edits = 1 + (int)(rnd() % 4);
            memcpy(mut, b, size);
            n = size;
            for (int k = 0; k < edits && n > 0; k++) {
                size_t at = (size_t)(rnd() % n);
                switch (rnd() % 4) {
                case 0: mut[at] ^= (unsigned char)(1u << (rnd() % 8)); break;
                case 1: mut[at] = (unsigned char)inject[rnd() % (sizeof inject - 1)]; break;
                case 2: n = at; break;                                  /* truncate */
                default: mut[at % 8] = (unsigned char)(rnd() & 0xff); break; /* length field */
                }
            }
            {
                unsigned char *exact = malloc(n ? n : 1);
                memcpy(exact, mut, n);
                LLVMFuzzerTestOneInput(exact, n);
                free(exact);
            }
            free(mut);
        }
        free(b);
    }
    closedir(d);
    assert_true(files >= 6);
    assert_true(loaded >= 2); /* the corpus holds valid files too */
    assert_true(loaded < files);
}

/* ---------------------------------------------------------------- PyTorch interop */

static int run_script(const char *args)
{
    const char *py = getenv("PYTHON3");
    char cmd[4096];
    int rc;
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/golden/safetensors_golden.py' %s", py ? py : "python3",
             ch_test_srcdir(), args);
    rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void check_against_manifest(const char *path, const json_t *tensors, int same_order)
{
    ch_safetensors_t *st;
    size_t i;
    const json_t *t;
    assert_ch_ok(ch_safetensors_open(path, &st));
    assert_int_equal(ch_safetensors_count(st), json_array_size(tensors));
    assert_string_equal(ch_safetensors_meta_get(st, "format"), "pt");
    json_array_foreach(tensors, i, t) {
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *dt = json_string_value(json_object_get(t, "dtype"));
        const json_t *shape = json_object_get(t, "shape");
        uLong crc = (uLong)json_integer_value(json_object_get(t, "crc32"));
        double sum = json_real_value(json_object_get(t, "sum")), mysum = 0;
        const ch_st_view_t *v = ch_safetensors_find(st, name);
        if (!v) fail_msg("%s: tensor %s missing", path, name);
        if (same_order) assert_string_equal(ch_safetensors_at(st, i)->name, name);
        assert_string_equal(ch_st_dtype_name(v->dtype), dt);
        assert_int_equal(v->ndim, json_array_size(shape));
        for (int d = 0; d < v->ndim; d++)
            assert_int_equal(v->shape[d], json_integer_value(json_array_get(shape, (size_t)d)));
        if (crc32(crc32(0L, Z_NULL, 0), v->data, (uInt)v->nbytes) != crc)
            fail_msg("%s: tensor %s bytes differ (crc32)", path, name);
        for (int64_t k = 0; k < ch_st_view_numel(v); k++) {
            if (v->dtype == CH_ST_F32) {
                float x;
                memcpy(&x, (const char *)v->data + 4 * k, 4);
                mysum += x;
            } else {
                int64_t x;
                memcpy(&x, (const char *)v->data + 8 * k, 8);
                mysum += (double)x;
            }
        }
        if (fabs(mysum - sum) > 1e-6 * (1 + fabs(sum)))
            fail_msg("%s: tensor %s sum %.9g, torch says %.9g", path, name, mysum, sum);
    }
    ch_safetensors_destroy(st);
}

static void test_pytorch_interop(void **state)
{
    char out[1024], args[4096], path[1200], manifest[1200];
    json_t *man;
    json_error_t jerr;
    const json_t *tensors;
    ch_safetensors_t *st;
    ch_st_view_t *views;
    size_t n;
    const char *have = getenv("HAVE_TORCH");
    ch_st_meta_t meta[2] = {{"format", "pt"}, {"writer", "cohort test_safetensors"}};

    if (!have || strcmp(have, "yes") != 0) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    snprintf(out, sizeof out, "%s/tests/golden-out/safetensors", ch_test_builddir());
    snprintf(args, sizeof args, "make '%s'", out);
    assert_int_equal(run_script(args), 0);

    snprintf(manifest, sizeof manifest, "%s/manifest.json", out);
    man = json_load_file(manifest, 0, &jerr);
    if (!man) fail_msg("%s: %s", manifest, jerr.text);
    tensors = json_object_get(man, "tensors");
    assert_true(json_array_size(tensors) == 122); /* resnet18: 62 params + 60 BN buffers */

    /* torch -> cohort: the hand-written file in state_dict order, and the
     * safetensors library's file (sorted by dtype then name) when present. */
    snprintf(path, sizeof path, "%s/torch_hand.safetensors", out);
    check_against_manifest(path, tensors, 1);
    if (json_is_true(json_object_get(man, "have_safetensors_lib"))) {
        snprintf(path, sizeof path, "%s/torch_lib.safetensors", out);
        check_against_manifest(path, tensors, 0);
    }

    /* cohort -> torch: write the state dict back in reverse order. */
    snprintf(path, sizeof path, "%s/torch_hand.safetensors", out);
    assert_ch_ok(ch_safetensors_open(path, &st));
    n = ch_safetensors_count(st);
    views = calloc(n, sizeof *views);
    for (size_t i = 0; i < n; i++) views[i] = *ch_safetensors_at(st, n - 1 - i);
    snprintf(path, sizeof path, "%s/cohort.safetensors", out);
    assert_ch_ok(ch_safetensors_write(path, views, n, meta, 2));
    free(views);
    ch_safetensors_destroy(st);
    snprintf(args, sizeof args, "check '%s' '%s/torch_hand.safetensors'", path, out);
    assert_int_equal(run_script(args), 0);
    json_decref(man);
}

static int teardown(void **state)
{
    if (tmpdir[0]) rmdir(tmpdir);
    return 0;
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_bytes),
        cmocka_unit_test(test_roundtrip_memory_and_file),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_reader_rejects),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_fuzz_corpus_replay),
        cmocka_unit_test_teardown(test_pytorch_interop, teardown),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
