/* Tests for io/formats/onnx (the ONNX reader): fixtures made at test time
 * by tests/golden/onnx_golden.py (a small CNN exported by torch.onnx in
 * TRAINING mode at opset 13 and 17, described by onnx's Python API; an
 * onnx.helper model with every converted element type and attribute kind)
 * read to what onnx's Python API and the PyTorch state dict say, bit for
 * bit; refused files each with its message (not ONNX, truncated, missing
 * initializer, opset out of range, external data, duplicate output, no
 * output, non-float input, raw_data length); hand-made wire-format cases
 * (deep nesting, bad wire types); the fuzz corpus replayed. */
#include "config.h"

#include "tests/harness.h"
#include "tests/nn_testutil.h"

#include "io/formats/onnx.h"
#include "io/formats/safetensors.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char gdir[1024];

static int fixtures(void)
{
    int rc = nt_run_golden("onnx_golden.py", "onnx", "", gdir, sizeof gdir);
    if (rc == 77) {
        ch_test_skip("tests/golden/onnx_golden.py: python3-torch or python3-onnx missing");
        return 0;
    }
    if (rc != 0) fail_msg("tests/golden/onnx_golden.py failed (exit %d)", rc);
    return 1;
}

static const char *fx(const char *name)
{
    static char path[4][1200];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", gdir, name);
    return path[k];
}

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)sz + 1);
    assert_non_null(b);
    if (fread(b, 1, (size_t)sz, f) != (size_t)sz) fail_msg("short read %s", path);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

/* t equals the reference tensor ref (F32 or I64) of st: dtype, shape, bits. */
static void same_as(const ch_onnx_tensor_t *t, const ch_safetensors_t *st, const char *ref)
{
    const ch_st_view_t *v = ch_safetensors_find(st, ref);
    if (!v) fail_msg("reference lacks '%s'", ref);
    assert_int_equal(t->dtype, v->dtype == CH_ST_F32 ? CH_F32 : CH_I64);
    if (t->ndim != v->ndim) fail_msg("'%s': ndim %d, expected %d", t->name, t->ndim, v->ndim);
    for (int d = 0; d < t->ndim; d++) assert_int_equal(t->dims[d], v->shape[d]);
    assert_int_equal(t->numel, (size_t)ch_st_view_numel(v));
    assert_non_null(t->data);
    if (memcmp(t->data, v->data, v->nbytes)) {
        if (t->dtype == CH_F32) { /* NaN payloads may differ; compare NaN as NaN */
            const float *a = t->data;
            for (size_t k = 0; k < t->numel; k++) {
                float b;
                memcpy(&b, (const char *)v->data + 4 * k, 4);
                if (isnan(a[k]) && isnan(b)) continue;
                if (memcmp(&a[k], &b, 4))
                    fail_msg("'%s'[%zu] = %a, expected %a", t->name, k, (double)a[k], (double)b);
            }
        } else {
            fail_msg("'%s' differs from the reference", t->name);
        }
    }
}

/* The model read from cnnN.onnx equals cnnN.txt (onnx's Python view) and
 * cnnN.safetensors (the state dict). */
static void check_cnn(const ch_onnx_model_t *m, const char *txt, const char *ref)
{
    FILE *f = fopen(txt, "r");
    if (!f) fail_msg("cannot open %s", txt);
    ch_safetensors_t *st = NULL;
    assert_ch_ok(ch_safetensors_open(ref, &st));
    char line[1024];
    int node = 0, init = 0, in = 0, outn = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char kw[32], name[256];
        int used = 0;
        if (sscanf(line, "%31s %255s %n", kw, name, &used) < 2) fail_msg("bad line '%s'", line);
        const char *rest = line + used;
        if (!strcmp(kw, "opset")) {
            assert_int_equal(m->opset, atoll(name));
        } else if (!strcmp(kw, "input") || !strcmp(kw, "output")) {
            int is_in = kw[0] == 'i';
            int k = is_in ? in++ : outn++;
            assert_true(k < (is_in ? m->n_inputs : m->n_outputs));
            const ch_onnx_value_info_t *vi = is_in ? &m->inputs[k] : &m->outputs[k];
            assert_string_equal(vi->name, name);
            assert_int_equal(vi->elem_type, 1);
            int nd = 0;
            long long dv;
            int adv;
            while (sscanf(rest, "%lld%n", &dv, &adv) == 1) {
                assert_true(nd < vi->ndim);
                assert_int_equal(vi->dims[nd], dv);
                nd++;
                rest += adv;
            }
            assert_int_equal(vi->ndim, nd);
        } else if (!strcmp(kw, "node")) {
            assert_true(node < m->n_nodes);
            assert_string_equal(m->nodes[node].op_type, name);
            assert_string_equal(m->nodes[node].domain, "");
            node++;
        } else if (!strcmp(kw, "init")) {
            assert_true(init < m->n_init);
            const ch_onnx_tensor_t *t = &m->init[init];
            assert_string_equal(t->name, name);
            assert_ptr_equal(ch_onnx_find_init(m, name), t);
            same_as(t, st, name); /* the state-dict tensor of that name */
            init++;
        } else if (!strcmp(kw, "attr")) {
            int ni = atoi(name);
            char an[64], ty[16];
            if (sscanf(rest, "%63s %15s %n", an, ty, &used) < 2) fail_msg("bad line '%s'", line);
            rest += used;
            assert_true(ni < m->n_nodes);
            const ch_onnx_attr_t *a = ch_onnx_node_attr(&m->nodes[ni], an);
            if (!a) fail_msg("node %d lacks attribute '%s'", ni, an);
            if (!strcmp(ty, "int")) {
                assert_int_equal(a->type, CH_ONNX_ATTR_INT);
                assert_int_equal(a->i, atoll(rest));
            } else {
                assert_int_equal(a->type, CH_ONNX_ATTR_INTS);
                int nv = 0;
                long long dv;
                int adv;
                while (sscanf(rest, "%lld%n", &dv, &adv) == 1) {
                    assert_true(nv < a->n);
                    assert_int_equal(a->ints[nv], dv);
                    nv++;
                    rest += adv;
                }
                assert_int_equal(a->n, nv);
            }
        } else {
            fail_msg("unknown line '%s'", line);
        }
    }
    fclose(f);
    assert_int_equal(node, m->n_nodes);
    assert_int_equal(init, m->n_init);
    assert_int_equal(in, m->n_inputs);
    assert_int_equal(outn, m->n_outputs);
    /* every float state-dict entry is an initializer (num_batches_tracked is
     * not used by the exported graph) */
    for (size_t k = 0; k < ch_safetensors_count(st); k++) {
        const ch_st_view_t *v = ch_safetensors_at(st, k);
        if (v->dtype == CH_ST_F32 && !ch_onnx_find_init(m, v->name))
            fail_msg("state-dict entry '%s' is not an initializer", v->name);
    }
    assert_null(ch_onnx_find_init(m, "no.such"));
    ch_safetensors_destroy(st);
}

static void test_cnn(void **state)
{
    (void)state;
    if (!fixtures()) return;
    for (int opset = 13; opset <= 17; opset += 4) {
        char onnx_name[64], txt[64], ref[64];
        snprintf(onnx_name, sizeof onnx_name, "cnn%d.onnx", opset);
        snprintf(txt, sizeof txt, "cnn%d.txt", opset);
        snprintf(ref, sizeof ref, "cnn%d.safetensors", opset);
        ch_onnx_model_t *m = NULL;
        assert_ch_ok(ch_onnx_load(fx(onnx_name), &m));
        assert_string_equal(m->producer_name, "pytorch");
        assert_true(m->ir_version >= 7);
        check_cnn(m, fx(txt), fx(ref));
        /* Conv 0 reads the graph input and two initializers; BN in training
         * mode has extra outputs */
        const ch_onnx_node_t *c = &m->nodes[0];
        assert_int_equal(c->n_in, 3);
        assert_string_equal(c->in[0], "input");
        assert_string_equal(c->in[1], "0.weight");
        assert_string_equal(c->in[2], "0.bias");
        assert_int_equal(c->n_out, 1);
        const ch_onnx_attr_t *tm = ch_onnx_node_attr(&m->nodes[1], "training_mode");
        if (opset >= 14 || tm) {
            assert_non_null(tm);
            assert_int_equal(tm->i, 1);
        }
        assert_null(ch_onnx_node_attr(c, "no_such"));
        ch_onnx_free(m);

        /* the same from memory */
        size_t n;
        unsigned char *b = read_all(fx(onnx_name), &n);
        assert_ch_ok(ch_onnx_parse(b, n, "mem", &m));
        free(b); /* the model does not refer to the buffer */
        check_cnn(m, fx(txt), fx(ref));
        ch_onnx_free(m);
    }
}

/* Weights also listed as graph inputs (keep_initializers_as_inputs=True)
 * are dropped from inputs; the rest reads as the plain export. */
static void test_inputs_as_initializers(void **state)
{
    (void)state;
    if (!fixtures()) return;
    ch_onnx_model_t *m = NULL;
    assert_ch_ok(ch_onnx_load(fx("cnn13_inputs.onnx"), &m));
    assert_int_equal(m->n_inputs, 1);
    assert_string_equal(m->inputs[0].name, "input");
    assert_int_equal(m->inputs[0].ndim, 4);
    assert_int_equal(m->n_init, 10);
    assert_non_null(ch_onnx_find_init(m, "1.running_var"));
    assert_int_equal(m->n_nodes, 7);
    assert_string_equal(m->nodes[6].op_type, "Gemm");
    ch_onnx_free(m);
}

static void test_dtypes(void **state)
{
    (void)state;
    if (!fixtures()) return;
    ch_onnx_model_t *m = NULL;
    assert_ch_ok(ch_onnx_load(fx("dtypes.onnx"), &m));
    ch_safetensors_t *st = NULL;
    assert_ch_ok(ch_safetensors_open(fx("dtypes.safetensors"), &st));
    assert_int_equal(m->opset, 15);
    assert_string_equal(m->producer_name, "onnx_golden.py");
    assert_string_equal(m->graph_name, "dtypes");
    static const struct { const char *name; int onnx_type; } want[] = {
        {"f16_raw", 10}, {"f16_typed", 10}, {"bf16_raw", 16}, {"f64_raw", 11}, {"f64_typed", 11},
        {"f32_typed", 1}, {"f32_raw", 1}, {"i32_typed", 6}, {"i16_raw", 5}, {"i8_typed", 3},
        {"u8_raw", 2}, {"bool_typed", 9}, {"u32_raw", 12}, {"i64_typed", 7}, {"i64_raw", 7},
        {"scalar", 1}, {"empty", 1},
    };
    assert_int_equal(m->n_init, (int)(sizeof want / sizeof want[0]));
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const ch_onnx_tensor_t *t = ch_onnx_find_init(m, want[k].name);
        if (!t) fail_msg("no initializer '%s'", want[k].name);
        assert_ptr_equal(t, &m->init[k]);
        assert_int_equal(t->onnx_type, want[k].onnx_type);
        same_as(t, st, want[k].name);
        if (t->dtype == CH_F32) assert_int_equal((uintptr_t)t->data % sizeof(float), 0);
        else assert_int_equal((uintptr_t)t->data % sizeof(int64_t), 0);
    }
    assert_int_equal(ch_onnx_find_init(m, "scalar")->ndim, 0);
    assert_int_equal(ch_onnx_find_init(m, "scalar")->numel, 1);
    assert_int_equal(ch_onnx_find_init(m, "empty")->numel, 0);

    /* X is the only input; outputs with a symbolic dim */
    assert_int_equal(m->n_inputs, 1);
    assert_string_equal(m->inputs[0].name, "X");
    assert_int_equal(m->inputs[0].ndim, 2);
    assert_int_equal(m->inputs[0].dims[0], -1);
    assert_int_equal(m->inputs[0].dims[1], 3);
    assert_int_equal(m->n_outputs, 3);
    assert_int_equal(m->outputs[2].elem_type, 11);

    /* the Constant node keeps its double tensor, converted */
    assert_int_equal(m->n_nodes, 3);
    const ch_onnx_node_t *c = &m->nodes[0];
    assert_string_equal(c->op_type, "Constant");
    assert_string_equal(c->name, "const0");
    assert_int_equal(c->n_in, 0);
    const ch_onnx_attr_t *v = ch_onnx_node_attr(c, "value");
    assert_non_null(v);
    assert_int_equal(v->type, CH_ONNX_ATTR_TENSOR);
    assert_non_null(v->t);
    assert_int_equal(v->t->onnx_type, 11);
    assert_string_equal(v->t->name, "");
    same_as(v->t, st, "const");

    /* every attribute kind on a custom-domain node */
    const ch_onnx_node_t *u = &m->nodes[2];
    assert_string_equal(u->domain, "com.cohort.test");
    assert_int_equal(u->n_in, 3);
    assert_string_equal(u->in[1], ""); /* omitted optional input */
    const ch_onnx_attr_t *a;
    assert_non_null(a = ch_onnx_node_attr(u, "af"));
    assert_int_equal(a->type, CH_ONNX_ATTR_FLOAT);
    assert_true(a->f == 0.25f);
    assert_non_null(a = ch_onnx_node_attr(u, "ai"));
    assert_int_equal(a->type, CH_ONNX_ATTR_INT);
    assert_int_equal(a->i, -3);
    assert_non_null(a = ch_onnx_node_attr(u, "as_"));
    assert_int_equal(a->type, CH_ONNX_ATTR_STRING);
    assert_string_equal(a->s, "hello");
    assert_non_null(a = ch_onnx_node_attr(u, "afs"));
    assert_int_equal(a->type, CH_ONNX_ATTR_FLOATS);
    assert_int_equal(a->n, 2);
    assert_true(a->floats[0] == 1.0f && a->floats[1] == 2.5f);
    assert_non_null(a = ch_onnx_node_attr(u, "ais"));
    assert_int_equal(a->type, CH_ONNX_ATTR_INTS);
    assert_int_equal(a->n, 3);
    assert_true(a->ints[0] == 1 && a->ints[1] == -2 && a->ints[2] == 3);
    assert_non_null(a = ch_onnx_node_attr(u, "ass"));
    assert_int_equal(a->type, CH_ONNX_ATTR_STRINGS);
    assert_int_equal(a->n, 2);
    assert_string_equal(a->strings[0], "a");
    assert_string_equal(a->strings[1], "bc");
    assert_non_null(a = ch_onnx_node_attr(u, "at"));
    assert_int_equal(a->type, CH_ONNX_ATTR_TENSOR);
    same_as(a->t, st, "at");
    ch_safetensors_destroy(st);
    ch_onnx_free(m);
}

static void test_refused(void **state)
{
    (void)state;
    if (!fixtures()) return;
    static const struct {
        const char *file;
        ch_status code;
        const char *needle, *needle2;
    } cases[] = {
        {"bad_random.onnx", CH_ERR_FORMAT, "not an ONNX model (protobuf ModelProto expected)", NULL},
        {"bad_pth.onnx", CH_ERR_FORMAT, "not an ONNX model (protobuf ModelProto expected)", NULL},
        {"bad_truncated.onnx", CH_ERR_FORMAT, "truncated", NULL},
        {"bad_missing_init.onnx", CH_ERR_FORMAT, "(Conv) input 1 '0.weight': missing initializer or input", NULL},
        {"bad_opset7.onnx", CH_ERR_UNSUPPORTED, "opset 7", "11..21"},
        {"bad_external.onnx", CH_ERR_UNSUPPORTED,
         "external data not supported: save with all tensors inside the file", "initializer '0.weight'"},
        {"bad_dup_output.onnx", CH_ERR_FORMAT, "node 1 'r1' (Relu) output 'Y': duplicate output name", NULL},
        {"bad_no_output.onnx", CH_ERR_FORMAT, "the graph has no output", NULL},
        {"bad_int_input.onnx", CH_ERR_UNSUPPORTED, "graph input 'X' has element type int64 (7), expected float", NULL},
        {"bad_raw_len.onnx", CH_ERR_FORMAT, "initializer 'W': raw_data has 10 bytes, expected 12", NULL},
        {"bad_dup_init.onnx", CH_ERR_FORMAT, "initializer 'W' appears twice", NULL},
        {"bad_neg_dim.onnx", CH_ERR_FORMAT, "initializer 'W': dimension 0 is -1, expected >= 0", NULL},
        {"bad_out_unknown.onnx", CH_ERR_FORMAT, "graph output 'Q' is produced by no node, input or initializer",
         NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ch_onnx_model_t *m = (ch_onnx_model_t *)&m;
        const char *path = fx(cases[k].file);
        assert_ch_error(ch_onnx_load(path, &m), cases[k].code, cases[k].needle);
        assert_null(m);
        const char *msg = ch_error_message();
        if (strncmp(msg, path, strlen(path))) fail_msg("message '%s' does not start with the file name", msg);
        if (strchr(msg, '\n')) fail_msg("message '%s' is not one line", msg);
        if (cases[k].needle2 && !strstr(msg, cases[k].needle2))
            fail_msg("message '%s' does not mention '%s'", msg, cases[k].needle2);
    }
    ch_onnx_model_t *m = NULL;
    assert_ch_error(ch_onnx_load(fx("no_such.onnx"), &m), CH_ERR_IO, "no_such.onnx");
    assert_ch_error(ch_onnx_load(gdir, &m), CH_ERR_IO, "not a regular file");
}

/* Hand-made protobuf bytes: the wire scan's own checks. */
static void test_wire(void **state)
{
    (void)state;
    ch_onnx_model_t *m = NULL;
    assert_ch_error(ch_onnx_parse("", 0, "empty", &m), CH_ERR_FORMAT, "empty: empty file: not an ONNX model");
    /* ir_version 8 only: a ModelProto without a graph */
    static const unsigned char nograph[] = {0x08, 0x08};
    assert_ch_error(ch_onnx_parse(nograph, sizeof nograph, "nograph", &m), CH_ERR_FORMAT,
                    "nograph: not an ONNX model (protobuf ModelProto expected): no graph");
    /* graph (field 7) announced with 100 bytes, 2 present */
    static const unsigned char cut[] = {0x08, 0x08, 0x3a, 100, 0x0a, 0x00};
    assert_ch_error(ch_onnx_parse(cut, sizeof cut, "cut", &m), CH_ERR_FORMAT, "cut: truncated ONNX file");
    /* a varint cut in the middle */
    static const unsigned char cutv[] = {0x08, 0x88};
    assert_ch_error(ch_onnx_parse(cutv, sizeof cutv, "cutv", &m), CH_ERR_FORMAT, "cutv: truncated");
    /* wire type 3 (group start) inside the graph */
    static const unsigned char grp[] = {0x08, 0x08, 0x3a, 0x01, 0x0b};
    assert_ch_error(ch_onnx_parse(grp, sizeof grp, "grp", &m), CH_ERR_FORMAT, "grp: corrupt ONNX file");
    /* a field longer than the message holding it (but inside the file) */
    static const unsigned char over[] = {0x3a, 0x02, 0x0a, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00};
    assert_ch_error(ch_onnx_parse(over, sizeof over, "over", &m), CH_ERR_FORMAT,
                    "runs past the end of the message holding it");
    /* nesting deeper than CH_ONNX_MAX_DEPTH: graph.node.attribute.g.node... */
    enum { LEVELS = 200 };
    unsigned char *deep = malloc(LEVELS * 3 * 4);
    assert_non_null(deep);
    /* build inside out: each level is tag + 2-byte varint length + body */
    size_t n = 0;
    unsigned char tmp[LEVELS * 3 * 4];
    for (int lv = 0; lv < LEVELS; lv++) {
        /* alternate GraphProto.node (1), NodeProto.attribute (5), AttributeProto.g (6) */
        static const unsigned char tags[3] = {0x0a, 0x2a, 0x32};
        unsigned char tag = lv == LEVELS - 1 ? 0x3a : tags[(LEVELS - 2 - lv) % 3];
        memcpy(tmp + 3, deep, n);
        tmp[0] = tag;
        tmp[1] = (unsigned char)(0x80 | (n & 0x7f));
        tmp[2] = (unsigned char)(n >> 7);
        n += 3;
        memcpy(deep, tmp, n);
    }
    assert_ch_error(ch_onnx_parse(deep, n, "deep", &m), CH_ERR_FORMAT, "deep: ONNX messages nested deeper than 64");
    free(deep);
    assert_null(m);
}

/* The fuzz target's seed corpus loads or fails with a message. */
static void test_corpus(void **state)
{
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/onnx", ch_test_srcdir());
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open %s", dir);
    int ok = 0, files = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[2400];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        ch_onnx_model_t *m = NULL;
        ch_error_clear();
        if (ch_onnx_load(p, &m) == CH_OK) {
            ok++;
            ch_onnx_free(m);
        } else {
            assert_true(ch_error_message()[0] != 0);
        }
        files++;
    }
    closedir(d);
    assert_true(files >= 2);
    assert_true(ok >= 1);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cnn),
        cmocka_unit_test(test_inputs_as_initializers),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_wire),
        cmocka_unit_test(test_corpus),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
