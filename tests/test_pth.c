/* Tests for io/formats/pth (PyTorch .pth/.pt) and its hook in the pretrained
 * loader: PyTorch-made fixtures (tests/golden/pth_golden.py: zip and
 * legacy, a torchvision resnet18, non-contiguous views, float16/bfloat16/
 * float64, checkpoint dicts, a DDP prefix) read to the expected tensors
 * bit for bit; refused files (a whole pickled model, os.system /
 * builtins.eval pickles: nothing executed, tensors outside their storage,
 * opcodes and rules); the same weights from .pth and safetensors giving
 * bitwise-equal models; written .pth files loaded by torch (weights_only,
 * strict); output.format; the fuzz corpus replayed. */
#include "config.h"

#include "tests/harness.h"
#include "tests/nn_testutil.h"

#include "framework/core/configuration.h"
#include "io/formats/pickle.h"
#include "io/formats/pth.h"
#include "io/formats/safetensors.h"
#include "io/state/train_state.h"
#include "models/models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char gdir[1024];

static int fixtures(void)
{
    if (nt_run_golden("pth_golden.py", "pth", "", gdir, sizeof gdir) != 0) {
        ch_test_skip("tests/golden/pth_golden.py failed (python3-torch missing?)");
        return 0;
    }
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

/* Every tensor of the .pth equals (name, order, dtype, shape, bytes) the
 * one of the safetensors file. */
static void same_tensors(const ch_pth_t *p, const char *expect_path)
{
    ch_safetensors_t *st = NULL;
    assert_ch_ok(ch_safetensors_open(expect_path, &st));
    assert_int_equal(ch_pth_count(p), ch_safetensors_count(st));
    for (size_t i = 0; i < ch_pth_count(p); i++) {
        const ch_st_view_t *a = ch_pth_at(p, i);
        const ch_st_view_t *b = ch_safetensors_find(st, a->name);
        if (!b) fail_msg("%s: '%s' not expected", expect_path, a->name);
        assert_ptr_equal(ch_pth_find(p, a->name), a);
        assert_int_equal(a->dtype, b->dtype);
        assert_int_equal(a->ndim, b->ndim);
        for (int d = 0; d < a->ndim; d++) assert_int_equal(a->shape[d], b->shape[d]);
        assert_int_equal(a->nbytes, b->nbytes);
        if (memcmp(a->data, b->data, a->nbytes))
            fail_msg("%s: '%s' differs from the expected bytes", expect_path, a->name);
    }
    ch_safetensors_destroy(st);
}

static void test_fixtures_read(void **state)
{
    (void)state;
    if (!fixtures()) return;
    static const struct {
        const char *file, *expect, *key, *found;
        ch_pth_kind_t kind;
    } cases[] = {
        {"resnet18_zip.pth", "resnet18.safetensors", NULL, "", CH_PTH_ZIP},
        {"resnet18_legacy.pth", "resnet18.safetensors", NULL, "", CH_PTH_LEGACY},
        {"noncontig_zip.pth", "noncontig_zip.expect.safetensors", NULL, "", CH_PTH_ZIP},
        {"noncontig_legacy.pth", "noncontig_legacy.expect.safetensors", NULL, "", CH_PTH_LEGACY},
        {"dtypes.pth", "dtypes.expect.safetensors", NULL, "", CH_PTH_ZIP},
        {"param.pth", "param.expect.safetensors", NULL, "", CH_PTH_ZIP},
        {"renamed_prefix.pth", "renamed_prefix.expect.safetensors", NULL, "", CH_PTH_ZIP},
        {"ckpt_model.pth", "ckpt_model.expect.safetensors", NULL, "model", CH_PTH_ZIP},
        {"ckpt_state_dict.pth", "ckpt_state_dict.expect.safetensors", NULL, "state_dict",
         CH_PTH_ZIP},
        {"ckpt_model_state_dict.pth", "ckpt_model_state_dict.expect.safetensors", NULL,
         "model_state_dict", CH_PTH_ZIP},
        {"ckpt_net.pth", "ckpt_net.expect.safetensors", "net", "net", CH_PTH_ZIP},
        {"ddp.pth", "ddp.expect.safetensors", NULL, "", CH_PTH_ZIP},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ch_pth_t *p = NULL;
        if (ch_pth_open(fx(cases[c].file), cases[c].key, &p))
            fail_msg("%s: %s", cases[c].file, ch_error_message());
        assert_int_equal(ch_pth_kind(p), cases[c].kind);
        assert_string_equal(ch_pth_state_key(p), cases[c].found);
        same_tensors(p, fx(cases[c].expect));
        ch_pth_destroy(p);
    }
    /* the 2x2 float32 of a hand-made zip: a view into the file */
    ch_pth_t *p = NULL;
    assert_ch_ok(ch_pth_open(fx("ok_handmade.pth"), NULL, &p));
    assert_int_equal(ch_pth_count(p), 1);
    assert_int_equal(ch_pth_at(p, 0)->nbytes, 16);
    ch_pth_destroy(p);
}

/* Opening path fails with code and a message containing want. */
static void refused(const char *file, const char *key, ch_status code, const char *want)
{
    ch_pth_t *p = NULL;
    ch_status s = ch_pth_open(fx(file), key, &p);
    if (s == CH_OK) fail_msg("%s was accepted", file);
    assert_null(p);
    if (s != code || !strstr(ch_error_message(), want))
        fail_msg("%s: %s '%s', expected %s with '%s'", file, ch_status_name(s),
                 ch_error_message(), ch_status_name(code), want);
    /* every message names the file */
    assert_non_null(strstr(ch_error_message(), file));
}

static void test_refused(void **state)
{
    (void)state;
    if (!fixtures()) return;
    refused("whole_module.pth", NULL, CH_ERR_FORMAT, "save model.state_dict() instead");
    refused("evil_system.pth", NULL, CH_ERR_FORMAT, "refused global posix.system");
    refused("evil_system_legacy.pth", NULL, CH_ERR_FORMAT, "refused global posix.system");
    refused("evil_eval.pth", NULL, CH_ERR_FORMAT, "refused global __builtin__.eval"); /* protocol 2 spells builtins so */
    /* nothing was executed */
    assert_int_not_equal(access(fx("PWNED"), F_OK), 0);
    refused("ckpt_net.pth", NULL, CH_ERR_FORMAT, "model.weights_key");
    refused("ckpt_model.pth", "nope", CH_ERR_FORMAT, "model.weights_key 'nope': no such key");
    refused("ckpt_model.pth", "epoch", CH_ERR_FORMAT, "not a state dict");
    /* a key asked of a plain state dict: said so, not its 122 tensor names */
    refused("resnet18_zip.pth", "model", CH_ERR_FORMAT,
            "model.weights_key 'model': no such key; the file is itself a state dict (122 "
            "tensors): leave model.weights_key unset");
    refused("bad_offset.pth", NULL, CH_ERR_FORMAT, "reaches past its storage");
    refused("bad_stride.pth", NULL, CH_ERR_FORMAT, "reaches past its storage");
    refused("bad_overflow.pth", NULL, CH_ERR_FORMAT, "reaches past its storage");
    refused("bad_numel.pth", NULL, CH_ERR_FORMAT, "declares 1000 elements");
    refused("bad_negative.pth", NULL, CH_ERR_FORMAT, ">= 0");
    refused("bad_expand.pth", NULL, CH_ERR_RANGE, "beyond the limit");
    refused("bad_dtype.pth", NULL, CH_ERR_UNSUPPORTED, "torch.IntStorage");
    refused("bad_setitem_list.pth", NULL, CH_ERR_FORMAT, "SETITEM on a list");
    refused("bad_append_dict.pth", NULL, CH_ERR_FORMAT, "APPEND to a dict");
    refused("bad_opcode.pth", NULL, CH_ERR_FORMAT, "opcode INST");
    refused("bad_memo.pth", NULL, CH_ERR_FORMAT, "memo entry 5 was never stored");
    refused("bad_no_stop.pth", NULL, CH_ERR_FORMAT, "without STOP");
    refused("bad_missing_record.pth", NULL, CH_ERR_FORMAT, "has no record 'archive/data/7'");
    refused("bad_compressed.pth", NULL, CH_ERR_FORMAT, "is compressed");
    refused("resnet18.safetensors", NULL, CH_ERR_FORMAT, "not a PyTorch .pth");
}

/* Loading buf under limits l fails with CH_ERR_RANGE and a message with want. */
static void limit_reached(const void *buf, size_t n, const ch_pk_limits_t *l, const char *want)
{
    ch_pk_t *p = NULL;
    ch_pk_value_t *root = NULL;
    assert_ch_ok(ch_pk_create("<t>", l, &p));
    assert_int_equal(ch_pk_load(p, buf, n, 0, &root, NULL), CH_ERR_RANGE);
    if (!strstr(ch_error_message(), want)) fail_msg("'%s' lacks '%s'", ch_error_message(), want);
    ch_pk_destroy(p);
}

/* Unpickler limits: each reached is an error naming it. */
static void test_pickle_limits(void **state)
{
    (void)state;
    /* 300 nested empty lists appended into each other: ops, stack */
    unsigned char buf[2048];
    size_t n = 0;
    buf[n++] = 0x80;
    buf[n++] = 2;
    for (int i = 0; i < 300; i++) buf[n++] = ']';
    for (int i = 0; i < 299; i++) buf[n++] = 'a';
    buf[n++] = '.';
    ch_pk_limits_t l;
    ch_pk_limits_default(&l);
    ch_pk_value_t *root = NULL;
    ch_pk_t *p = NULL;
    assert_ch_ok(ch_pk_create("<t>", &l, &p));
    assert_ch_ok(ch_pk_load(p, buf, n, 0, &root, NULL));
    assert_int_equal(root->kind, CH_PK_LIST);
    ch_pk_destroy(p);
    l.max_stack = 100;
    limit_reached(buf, n, &l, "stack deeper than the limit of 100");
    ch_pk_limits_default(&l);
    l.max_ops = 50;
    limit_reached(buf, n, &l, "more than 50 opcodes");
    ch_pk_limits_default(&l);
    l.max_bytes = 4096;
    limit_reached(buf, n, &l, "exceed the limit of 4096 bytes");
    /* a memo index past the limit */
    const unsigned char memo[] = {0x80, 2, 'N', 'r', 0xff, 0xff, 0xff, 0x7f, '.'};
    ch_pk_limits_default(&l);
    limit_reached(memo, sizeof memo, &l, "memo index 2147483647 exceeds");
    /* a MARK is not a value: it cannot be memoized (then fetched into a container) */
    const unsigned char mark[] = {0x80, 2, '(', 'q', 0, '.'};
    ch_pk_t *q = NULL;
    assert_ch_ok(ch_pk_create("<t>", NULL, &q));
    assert_int_equal(ch_pk_load(q, mark, sizeof mark, 0, &root, NULL), CH_ERR_FORMAT);
    assert_non_null(strstr(ch_error_message(), "memo put of a MARK"));
    ch_pk_destroy(q);
}

static ch_model_t *make(const char *arch, int in_ch, int classes, uint64_t seed)
{
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.in_channels = in_ch;
    o.num_classes = classes;
    o.seed = seed;
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_create(arch, &o, &m));
    return m;
}

static void assert_same_models(const ch_model_t *a, const ch_model_t *b)
{
    assert_int_equal(ch_model_num_entries(a), ch_model_num_entries(b));
    for (int i = 0; i < ch_model_num_entries(a); i++) {
        const ch_param_t *x = ch_model_entry(a, i), *y = ch_model_entry(b, i);
        assert_string_equal(x->name, y->name);
        if (memcmp(x->data, y->data, x->numel * ch_dtype_size(x->dtype)))
            fail_msg("'%s' differs", x->name);
    }
}

static void test_pretrained_same_as_safetensors(void **state)
{
    (void)state;
    if (!fixtures()) return;
    ch_model_t *z = make("resnet18", 3, 10, 1), *l = make("resnet18", 3, 10, 2),
               *s = make("resnet18", 3, 10, 3);
    ch_pretrained_report_t r;
    assert_ch_ok(ch_train_state_load_pretrained(z, fx("resnet18_zip.pth"), NULL, &r));
    assert_int_equal(r.loaded, ch_model_num_entries(z));
    assert_ch_ok(ch_train_state_load_pretrained(l, fx("resnet18_legacy.pth"), NULL, &r));
    assert_int_equal(r.loaded, ch_model_num_entries(l));
    assert_ch_ok(ch_train_state_load_pretrained(s, fx("resnet18.safetensors"), NULL, &r));
    assert_int_equal(r.loaded, ch_model_num_entries(s));
    assert_same_models(z, s);
    assert_same_models(l, s);
    ch_model_destroy(z);
    ch_model_destroy(l);
    ch_model_destroy(s);
    /* checkpoint dicts and the DDP prefix (smallcnn, 1 channel, 10 classes) */
    ch_model_t *a = make("smallcnn", 1, 10, 1), *b = make("smallcnn", 1, 10, 2);
    assert_ch_ok(ch_train_state_load_pretrained(a, fx("ckpt_model.pth"), NULL, &r));
    assert_int_equal(r.loaded, ch_model_num_entries(a));
    assert_ch_ok(ch_train_state_load_pretrained(b, fx("ddp.pth"), NULL, &r));
    assert_int_equal(r.prefix_stripped, 1);
    assert_int_equal(r.loaded, ch_model_num_entries(b));
    assert_same_models(a, b);
    ch_pretrained_options_t po;
    ch_pretrained_options_default(&po);
    assert_int_equal(ch_train_state_load_pretrained(b, fx("ckpt_net.pth"), &po, NULL),
                     CH_ERR_FORMAT);
    assert_non_null(strstr(ch_error_message(), "model.weights"));
    po.weights_key = "net";
    assert_ch_ok(ch_train_state_load_pretrained(b, fx("ckpt_net.pth"), &po, &r));
    assert_same_models(a, b);
    assert_int_equal(ch_train_state_load_pretrained(b, fx("whole_module.pth"), NULL, NULL),
                     CH_ERR_FORMAT);
    assert_non_null(strstr(ch_error_message(), "save model.state_dict() instead"));
    ch_model_destroy(a);
    ch_model_destroy(b);
}

/* Written .pth: read back bit for bit, and by torch (weights_only, strict). */
static void write_and_check(const char *arch, int in_ch, int classes)
{
    char pth[1200], st[1200], cmd[4096];
    snprintf(pth, sizeof pth, "%s/written_%s.pth", gdir, arch);
    snprintf(st, sizeof st, "%s/written_%s.safetensors", gdir, arch);
    ch_model_t *m = make(arch, in_ch, classes, 7), *back = make(arch, in_ch, classes, 8);
    assert_ch_ok(ch_train_state_write_model(m, pth));
    assert_ch_ok(ch_train_state_write_model(m, st));
    ch_pth_t *p = NULL;
    assert_ch_ok(ch_pth_open(pth, NULL, &p));
    same_tensors(p, st);
    ch_pth_destroy(p);
    ch_pretrained_report_t r;
    assert_ch_ok(ch_train_state_load_pretrained(back, pth, NULL, &r));
    assert_int_equal(r.loaded, ch_model_num_entries(m));
    assert_same_models(m, back);
    const char *py = getenv("PYTHON3");
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 '%s' '%s/tests/golden/pth_golden.py' "
             "--check-written '%s' %s %d %d '%s'", py ? py : "python3", ch_test_srcdir(), pth,
             arch, classes, in_ch, st);
    int rc = system(cmd);
    if (rc != 0) fail_msg("torch did not take %s (%s)", pth, cmd);
    /* the same model gives the same bytes (no timestamps) */
    char again[1300];
    snprintf(again, sizeof again, "%s.again.pth", pth);
    assert_ch_ok(ch_train_state_write_model(m, again));
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", pth, again);
    assert_int_equal(system(cmd), 0);
    unlink(again);
    ch_model_destroy(m);
    ch_model_destroy(back);
}

static void test_write_pth(void **state)
{
    (void)state;
    if (!fixtures()) return;
    write_and_check("resnet18", 3, 10);
    write_and_check("smallcnn", 1, 10);
    /* a bad view is refused and nothing is written */
    char pth[1200];
    snprintf(pth, sizeof pth, "%s/refused.pth", gdir);
    unlink(pth);
    float x[2] = {1, 2};
    ch_st_view_t v[2] = {{"a", CH_ST_F32, 1, {2}, x, 8}, {"a", CH_ST_F32, 1, {2}, x, 8}};
    assert_int_equal(ch_pth_write(pth, v, 2), CH_ERR_INVALID);
    assert_non_null(strstr(ch_error_message(), "appears twice"));
    v[1].name = "b";
    v[1].nbytes = 4;
    assert_int_equal(ch_pth_write(pth, v, 2), CH_ERR_INVALID);
    assert_int_not_equal(access(pth, F_OK), 0);
    assert_int_equal(ch_pth_write("/nonexistent-dir/x.pth", v, 1), CH_ERR_IO);
}

static void test_output_format(void **state)
{
    (void)state;
    char *argv[] = {"prog", "--output.dir=/tmp/o", "--output.format=pth", NULL};
    ch_config_t *cfg = NULL;
    ch_config_table_t t = ch_train_output_config_table();
    assert_ch_ok(ch_config_load_tables(&t, 1, NULL, 3, argv, &cfg));
    ch_train_output_options_t o;
    assert_ch_ok(ch_train_output_options_from_config(cfg, &o));
    assert_string_equal(o.format, "pth");
    char buf[256];
    assert_ch_ok(ch_train_output_model_path(&o, 4, buf, sizeof buf));
    assert_string_equal(buf, "/tmp/o/model-4.pth");
    assert_ch_ok(ch_train_output_resume_path(&o, buf, sizeof buf));
    assert_string_equal(buf, "/tmp/o/resume.safetensors");
    ch_config_destroy(cfg);
    char *bad[] = {"prog", "--output.format=onnx", NULL};
    assert_ch_ok(ch_config_load_tables(&t, 1, NULL, 2, bad, &cfg));
    assert_int_equal(ch_train_output_options_from_config(cfg, &o), CH_ERR_CONFIG);
    assert_non_null(strstr(ch_error_message(), "output.format = 'onnx' is not one of: safetensors, pth"));
    ch_config_destroy(cfg);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_read),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_pickle_limits),
        cmocka_unit_test(test_pretrained_same_as_safetensors),
        cmocka_unit_test(test_write_pth),
        cmocka_unit_test(test_output_format),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
