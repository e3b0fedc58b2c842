/* Tests for io/state/train_state: model and resume files round trip (model,
 * momentum buffers, progress), resume validation (world size, steps per
 * epoch, seed, files without epoch_step), pretrained loading (exact shapes
 * by default, the element-count rule as an option, the "module." prefix of
 * DDP state dicts, a PyTorch-made DDP file, refusal of the wrong file), and
 * the output.* helpers. Single process. */
#include "config.h"

#include "tests/harness.h"
#include "tests/nn_testutil.h"

#include "framework/core/configuration.h"
#include "framework/train/optim.h"
#include "io/state/checkpoint.h"
#include "io/formats/safetensors.h"
#include "io/state/train_state.h"
#include "models/models.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[512];

static const char *path_in(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "%s/tests/tmp-train-state-%d", ch_test_builddir(), (int)getpid());
    mkdir(dir, 0755);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d) return 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(path_in(e->d_name));
    closedir(d);
    rmdir(dir);
    return 0;
}

static ch_model_t *small(uint64_t seed, int classes)
{
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.in_channels = 1;
    o.num_classes = classes;
    o.seed = seed;
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_create("smallcnn", &o, &m));
    return m;
}

/* Every entry of a and b bitwise equal (1) or not (0). */
static int same_state(ch_model_t *a, ch_model_t *b)
{
    int n = ch_model_num_entries(a);
    if (n != ch_model_num_entries(b)) return 0;
    for (int i = 0; i < n; i++) {
        const ch_param_t *x = ch_model_entry(a, i), *y = ch_model_entry(b, i);
        if (strcmp(x->name, y->name) || x->numel != y->numel ||
            memcmp(x->data, y->data, x->numel * ch_dtype_size(x->dtype)))
            return 0;
    }
    return 1;
}

static int same_entry(ch_model_t *a, ch_model_t *b, const char *name)
{
    const ch_param_t *x = ch_model_find(a, name), *y = ch_model_find(b, name);
    assert_non_null(x);
    assert_non_null(y);
    return x->numel == y->numel && !memcmp(x->data, y->data, x->numel * ch_dtype_size(x->dtype));
}

/* An SGD with momentum over m after one step on made-up gradients, so that
 * every parameter has a momentum buffer. */
static void set_grads(ch_model_t *m)
{
    for (int i = 0; i < ch_model_num_params(m); i++) {
        ch_param_t *p = ch_model_param(m, i);
        for (size_t k = 0; k < p->numel; k++) p->grad[k] = 0.001f * (float)((k + 3 * (size_t)i) % 17);
    }
}

static ch_sgd_t *stepped_sgd(ch_model_t *m)
{
    ch_sgd_options_t so = {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
    ch_sgd_t *sgd = NULL;
    assert_ch_ok(ch_sgd_create(&so, &sgd));
    assert_ch_ok(ch_sgd_add_model(sgd, m));
    set_grads(m);
    assert_ch_ok(ch_sgd_step(sgd));
    return sgd;
}

static ch_sgd_t *fresh_sgd(ch_model_t *m)
{
    ch_sgd_options_t so = {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
    ch_sgd_t *sgd = NULL;
    assert_ch_ok(ch_sgd_create(&so, &sgd));
    assert_ch_ok(ch_sgd_add_model(sgd, m));
    return sgd;
}

/* ---------------------------------------------------------------- files */

static void test_model_file_round_trip(void **state)
{
    (void)state;
    ch_model_t *a = small(1, 10), *b = small(2, 10);
    assert_false(same_state(a, b));
    assert_ch_ok(ch_train_state_write_model(a, path_in("model-0.safetensors")));
    ch_pretrained_report_t r;
    assert_ch_ok(ch_train_state_load_pretrained(b, path_in("model-0.safetensors"), NULL, &r));
    assert_true(same_state(a, b));
    assert_int_equal(r.loaded, ch_model_num_entries(a));
    assert_int_equal(r.n_tensors, ch_model_num_entries(a));
    assert_int_equal(r.not_in_model + r.other_shape + r.optimizer_state + r.reshaped + r.not_in_file, 0);
    assert_int_equal(r.prefix_stripped, 0);
    /* torchvision names and dtypes, in state-dict order */
    ch_safetensors_t *st = NULL;
    assert_ch_ok(ch_safetensors_open(path_in("model-0.safetensors"), &st));
    assert_int_equal(ch_safetensors_count(st), ch_model_num_entries(a));
    assert_non_null(ch_safetensors_find(st, "bn1.num_batches_tracked"));
    assert_int_equal(ch_safetensors_find(st, "bn1.num_batches_tracked")->dtype, CH_ST_I64);
    ch_safetensors_destroy(st);
    ch_model_destroy(a);
    ch_model_destroy(b);
}

static void test_resume_round_trip(void **state)
{
    (void)state;
    ch_model_t *a = small(1, 10), *b = small(2, 10);
    ch_sgd_t *sa = stepped_sgd(a), *sb = fresh_sgd(b);
    ch_train_progress_t p = {.epoch = 3, .global_step = 40, .epoch_step = 5, .epoch_steps = 12,
                             .seed = 77, .world_size = 2, .epoch_loss_sum = 1.0 / 3.0,
                             .epoch_loss_steps = 5};
    assert_ch_ok(ch_train_state_write_resume(a, sa, path_in("resume.safetensors"), &p,
                                             "train = { seed = 77; };"));
    ch_train_progress_t q;
    assert_ch_ok(ch_train_state_read_resume(b, sb, path_in("resume.safetensors"), &q));
    assert_true(same_state(a, b));
    assert_int_equal(q.epoch, 3);
    assert_int_equal(q.global_step, 40);
    assert_int_equal(q.epoch_step, 5);
    assert_int_equal(q.epoch_steps, 12);
    assert_int_equal(q.seed, 77);
    assert_int_equal(q.world_size, 2);
    assert_true(q.epoch_loss_sum == 1.0 / 3.0); /* %.17g round trip */
    assert_int_equal(q.epoch_loss_steps, 5);
    /* every momentum buffer came back, bitwise */
    assert_int_equal(ch_sgd_num_params(sa), ch_sgd_num_params(sb));
    for (int i = 0; i < ch_sgd_num_params(sa); i++) {
        const char *na, *nb;
        const float *ba, *bb;
        size_t ka, kb;
        int ha, hb;
        assert_ch_ok(ch_sgd_buffer(sa, i, &na, &ba, &ka, &ha));
        assert_ch_ok(ch_sgd_buffer(sb, i, &nb, &bb, &kb, &hb));
        assert_string_equal(na, nb);
        assert_true(ha && hb);
        assert_int_equal(ka, kb);
        assert_memory_equal(ba, bb, ka * sizeof(float));
    }
    /* the next steps agree too (the buffers are marked started) */
    set_grads(b);
    assert_ch_ok(ch_sgd_step(sa));
    assert_ch_ok(ch_sgd_step(sb));
    assert_true(same_state(a, b));
    ch_sgd_destroy(sa);
    ch_sgd_destroy(sb);
    ch_model_destroy(a);
    ch_model_destroy(b);
}

static void test_resume_errors(void **state)
{
    (void)state;
    ch_model_t *a = small(1, 10), *other = small(1, 5);
    ch_sgd_t *sa = stepped_sgd(a);
    ch_train_progress_t p = {.epoch = 1, .global_step = 8, .epoch_step = 0, .epoch_steps = 8,
                             .seed = 0, .world_size = 2};
    /* a step outside the epoch is not written */
    p.epoch_step = 8;
    assert_ch_error(ch_train_state_write_resume(a, sa, path_in("r.safetensors"), &p, ""),
                    CH_ERR_INVALID, "not inside an epoch of 8 steps");
    p.epoch_step = 0;
    assert_ch_ok(ch_train_state_write_resume(a, sa, path_in("r.safetensors"), &p, ""));
    /* another model: the tensor with another shape is named */
    ch_train_progress_t q;
    assert_ch_error(ch_train_state_read_resume(other, NULL, path_in("r.safetensors"), &q),
                    CH_ERR_INVALID, "fc.weight");
    /* a model file is not a resume file */
    assert_ch_ok(ch_train_state_write_model(a, path_in("m.safetensors")));
    assert_ch_error(ch_train_state_read_resume(a, NULL, path_in("m.safetensors"), &q),
                    CH_ERR_FORMAT, "m.safetensors");
    /* malformed epoch_step metadata names the key and value */
    ch_st_view_t v[1] = {{.name = "x", .dtype = CH_ST_F32, .ndim = 1, .shape = {1}}};
    float one = 1;
    v[0].data = &one;
    v[0].nbytes = 4;
    ch_resume_info_t info = {.epoch = 1, .global_step = 8, .world_size = 2, .rng_state = "",
                             .config = ""};
    ch_st_meta_t bad[1] = {{"epoch_step", "three"}};
    assert_ch_ok(ch_checkpoint_write_resume(path_in("bad.safetensors"), v, 1, NULL, 0, &info, bad, 1));
    assert_ch_error(ch_train_state_read_resume(a, NULL, path_in("bad.safetensors"), &q),
                    CH_ERR_FORMAT, "epoch_step = 'three'");
    ch_sgd_destroy(sa);
    ch_model_destroy(a);
    ch_model_destroy(other);
}

/* ---------------------------------------------------------------- resume checks */

static void test_resume_check(void **state)
{
    (void)state;
    int64_t st = -7;
    /* written by 2 ranks at the start of epoch 1 (8 steps per epoch there) */
    ch_train_progress_t b = {.epoch = 1, .global_step = 8, .epoch_step = 0, .epoch_steps = 8,
                             .seed = 0, .world_size = 2};
    assert_ch_ok(ch_train_resume_check("f", &b, 2, 8, 0, &st));
    assert_int_equal(st, 0);
    /* at an epoch boundary another world size continues: 1 rank has 16 steps */
    st = -7;
    assert_ch_ok(ch_train_resume_check("f", &b, 1, 16, 0, &st));
    assert_int_equal(st, 0);
    assert_ch_ok(ch_train_resume_check("f", &b, 4, 4, 0, &st));
    /* another seed is refused */
    assert_ch_error(ch_train_resume_check("f", &b, 2, 8, 5, &st), CH_ERR_INVALID,
                    "f used train.seed 0 but this run has 5");
    /* mid-epoch: the same world and steps per epoch continue ... */
    ch_train_progress_t m = b;
    m.global_step = 11;
    m.epoch_step = 3;
    assert_ch_ok(ch_train_resume_check("f", &m, 2, 8, 0, &st));
    assert_int_equal(st, 3);
    /* ... another world size is refused with that reason ... */
    assert_ch_error(ch_train_resume_check("f", &m, 1, 16, 0, &st), CH_ERR_INVALID,
                    "written mid-epoch (epoch 1, step 3) by 2 ranks; resuming it with 1 rank");
    /* ... and so are other steps per epoch (batch size changed) */
    assert_ch_error(ch_train_resume_check("f", &m, 2, 4, 0, &st), CH_ERR_INVALID,
                    "with 8 steps per epoch, this run has 4");
    /* a file without epoch_step: derived when the world size is the same */
    ch_train_progress_t old = m;
    old.epoch_step = -1;
    old.epoch_steps = -1;
    assert_ch_ok(ch_train_resume_check("f", &old, 2, 8, 0, &st));
    assert_int_equal(st, 3);
    assert_ch_error(ch_train_resume_check("f", &old, 2, 2, 0, &st), CH_ERR_FORMAT,
                    "global step 11 does not fall in epoch 1 with 2 steps per epoch");
    assert_ch_error(ch_train_resume_check("f", &old, 1, 16, 0, &st), CH_ERR_INVALID,
                    "resume it with 2 ranks");
}

/* ---------------------------------------------------------------- pretrained */

/* Write model m's state dict under transformed names / shapes: prefix every
 * name (only the first with first_only), give `reshape_name` (if not NULL)
 * the shape new_shape, and add a momentum buffer of fc.bias. */
static void write_variant(ch_model_t *m, const char *path, const char *prefix, int first_only,
                          const char *reshape_name, int ndim, const int64_t *new_shape,
                          int extra_momentum)
{
    int n = ch_model_num_entries(m);
    ch_st_view_t *v = calloc((size_t)n + 1, sizeof *v);
    char (*names)[128] = calloc((size_t)n + 1, sizeof *names);
    assert_non_null(v);
    assert_non_null(names);
    for (int i = 0; i < n; i++) {
        const ch_param_t *e = ch_model_entry(m, i);
        snprintf(names[i], sizeof names[i], "%s%s", i == 0 || !first_only ? prefix : "", e->name);
        v[i].name = names[i];
        v[i].dtype = e->dtype == CH_I64 ? CH_ST_I64 : CH_ST_F32;
        v[i].ndim = e->ndim;
        memcpy(v[i].shape, e->shape, sizeof(int64_t) * (size_t)e->ndim);
        if (reshape_name && !strcmp(e->name, reshape_name)) {
            v[i].ndim = ndim;
            memcpy(v[i].shape, new_shape, sizeof(int64_t) * (size_t)ndim);
        }
        v[i].data = e->data;
        v[i].nbytes = e->numel * ch_dtype_size(e->dtype);
    }
    if (extra_momentum) {
        const ch_param_t *e = ch_model_find(m, "fc.bias");
        snprintf(names[n], sizeof names[n], "%sfc.bias", CH_CKPT_MOMENTUM_PREFIX);
        v[n] = v[e->index];
        v[n].name = names[n];
    }
    assert_ch_ok(ch_safetensors_write(path, v, (size_t)n + (extra_momentum ? 1 : 0), NULL, 0));
    free(v);
    free(names);
}

static void test_pretrained_exact_shapes(void **state)
{
    (void)state;
    ch_model_t *a = small(1, 10), *b = small(2, 10), *c = small(2, 10);
    const int64_t flat[4] = {16, 1, 9, 1}; /* conv1.weight is [16, 1, 3, 3] */
    write_variant(a, path_in("reshaped.safetensors"), "", 0, "conv1.weight", 4, flat, 0);
    /* default: exact shapes; conv1.weight is skipped, the rest loads */
    ch_pretrained_report_t r;
    assert_ch_ok(ch_train_state_load_pretrained(b, path_in("reshaped.safetensors"), NULL, &r));
    int ne = ch_model_num_entries(a);
    assert_int_equal(r.loaded, ne - 1);
    assert_int_equal(r.other_shape, 1);
    assert_int_equal(r.reshaped, 0);
    assert_false(same_entry(a, b, "conv1.weight"));
    assert_true(same_entry(c, b, "conv1.weight")); /* kept its own values */
    assert_true(same_entry(a, b, "conv2.weight"));
    assert_true(same_entry(a, b, "bn1.num_batches_tracked"));
    /* the seed's element-count rule as an option */
    ch_pretrained_options_t o;
    ch_pretrained_options_default(&o);
    o.reshape = 1;
    assert_ch_ok(ch_train_state_load_pretrained(c, path_in("reshaped.safetensors"), &o, &r));
    assert_int_equal(r.loaded, ne);
    assert_int_equal(r.reshaped, 1);
    assert_int_equal(r.other_shape, 0);
    assert_true(same_state(a, c));
    ch_model_destroy(a);
    ch_model_destroy(b);
    ch_model_destroy(c);
}

static void test_pretrained_skips_other_classes(void **state)
{
    (void)state;
    /* fine-tuning: a 10-class file into a 5-class model skips fc only */
    ch_model_t *a = small(1, 10), *b = small(2, 5);
    assert_ch_ok(ch_train_state_write_model(a, path_in("ten.safetensors")));
    ch_pretrained_report_t r;
    assert_ch_ok(ch_train_state_load_pretrained(b, path_in("ten.safetensors"), NULL, &r));
    assert_int_equal(r.other_shape, 2);
    assert_int_equal(r.loaded, ch_model_num_entries(a) - 2);
    assert_true(same_entry(a, b, "conv1.weight"));
    ch_model_destroy(a);
    ch_model_destroy(b);
}

static void test_pretrained_module_prefix(void **state)
{
    (void)state;
    ch_model_t *a = small(1, 10), *b = small(2, 10), *c = small(2, 10);
    write_variant(a, path_in("ddp.safetensors"), "module.", 0, NULL, 0, NULL, 0);
    ch_pretrained_report_t r;
    assert_ch_ok(ch_train_state_load_pretrained(b, path_in("ddp.safetensors"), NULL, &r));
    assert_int_equal(r.prefix_stripped, 1);
    assert_int_equal(r.loaded, ch_model_num_entries(a));
    assert_true(same_state(a, b));
    /* one prefix only: "module.module.x" keeps one */
    write_variant(a, path_in("ddp2.safetensors"), "module.module.", 0, NULL, 0, NULL, 0);
    assert_ch_error(ch_train_state_load_pretrained(c, path_in("ddp2.safetensors"), NULL, &r),
                    CH_ERR_FORMAT, "no tensor matching");
    assert_int_equal(r.prefix_stripped, 1);
    assert_int_equal(r.not_in_model, ch_model_num_entries(a));
    ch_model_t *ref = small(2, 10);
    assert_true(same_state(c, ref)); /* refused: the model is unchanged */
    ch_model_destroy(ref);
    ch_model_destroy(a);
    ch_model_destroy(b);
    ch_model_destroy(c);
}

static void test_pretrained_mixed_prefix_not_stripped(void **state)
{
    (void)state;
    /* only some names carry "module.": nothing is stripped (the prefix is
     * removed only when every key has it) */
    ch_model_t *a = small(1, 10), *b = small(2, 10);
    int n = ch_model_num_entries(a);
    write_variant(a, path_in("mixed.safetensors"), "module.", 1, NULL, 0, NULL, 0);
    ch_pretrained_report_t r;
    assert_ch_ok(ch_train_state_load_pretrained(b, path_in("mixed.safetensors"), NULL, &r));
    assert_int_equal(r.prefix_stripped, 0);
    assert_int_equal(r.not_in_model, 1);
    assert_int_equal(r.not_in_file, 1); /* the prefixed one's model entry */
    assert_int_equal(r.loaded, n - 1);
    ch_model_destroy(a);
    ch_model_destroy(b);
}

static void test_pretrained_refuses_wrong_file(void **state)
{
    (void)state;
    /* a smallcnn state dict is not a resnet18 one: refused, model unchanged */
    ch_model_t *a = small(1, 10);
    assert_ch_ok(ch_train_state_write_model(a, path_in("small.safetensors")));
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.in_channels = 1;
    o.num_classes = 10;
    ch_model_t *r18 = NULL, *ref = NULL;
    assert_ch_ok(ch_model_create("resnet18", &o, &r18));
    assert_ch_ok(ch_model_create("resnet18", &o, &ref));
    ch_pretrained_report_t r;
    assert_ch_error(ch_train_state_load_pretrained(r18, path_in("small.safetensors"), NULL, &r),
                    CH_ERR_FORMAT, "no tensor matching most of the model");
    assert_true(same_state(r18, ref));
    assert_true(r.other_shape > 0);
    /* not a safetensors file at all: names the file */
    FILE *f = fopen(path_in("garbage.safetensors"), "w");
    assert_non_null(f);
    fputs("optimizer: { lr = 0.01; };\n", f);
    fclose(f);
    assert_ch_error(ch_train_state_load_pretrained(r18, path_in("garbage.safetensors"), NULL, &r),
                    CH_ERR_FORMAT, "garbage.safetensors");
    ch_model_destroy(a);
    ch_model_destroy(r18);
    ch_model_destroy(ref);
}

static void test_pretrained_from_resume_file(void **state)
{
    (void)state;
    /* a resume file works as pretrained weights; its momentum buffers are
     * counted as optimizer state, not as unknown tensors */
    ch_model_t *a = small(1, 10), *b = small(2, 10);
    write_variant(a, path_in("withmom.safetensors"), "", 0, NULL, 0, NULL, 1);
    ch_pretrained_report_t r;
    assert_ch_ok(ch_train_state_load_pretrained(b, path_in("withmom.safetensors"), NULL, &r));
    assert_int_equal(r.optimizer_state, 1);
    assert_int_equal(r.not_in_model, 0);
    assert_true(same_state(a, b));
    ch_model_destroy(a);
    ch_model_destroy(b);
}

static void test_pretrained_pytorch_ddp_file(void **state)
{
    (void)state;
    /* torch.nn.parallel.DistributedDataParallel(smallcnn).state_dict(), every
     * key "module."-prefixed, written by tests/golden/pretrained_golden.py */
    char gdir[1024];
    if (nt_run_golden("pretrained_golden.py", "pretrained", "", gdir, sizeof gdir) != 0) {
        ch_test_skip("tests/golden/pretrained_golden.py failed (python3-torch missing?)");
        return;
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/ddp_smallcnn.safetensors", gdir);
    ch_safetensors_t *st = NULL;
    assert_ch_ok(ch_safetensors_open(path, &st));
    assert_non_null(ch_safetensors_find(st, "module.conv1.weight"));
    ch_model_t *m = small(3, 10);
    ch_pretrained_report_t r;
    assert_ch_ok(ch_train_state_load_pretrained(m, path, NULL, &r));
    assert_int_equal(r.prefix_stripped, 1);
    assert_int_equal(r.loaded, ch_model_num_entries(m));
    for (int i = 0; i < ch_model_num_entries(m); i++) {
        const ch_param_t *e = ch_model_entry(m, i);
        char name[256];
        snprintf(name, sizeof name, "module.%s", e->name);
        const ch_st_view_t *v = ch_safetensors_find(st, name);
        assert_non_null(v);
        assert_int_equal(v->nbytes, e->numel * ch_dtype_size(e->dtype));
        assert_memory_equal(v->data, e->data, v->nbytes);
    }
    ch_safetensors_destroy(st);
    ch_model_destroy(m);
}

/* ---------------------------------------------------------------- output.* */

static void test_output_options(void **state)
{
    (void)state;
    char *argv[] = {"prog", "--output.dir", dir, "--output.save_every=2", NULL};
    ch_config_t *cfg = NULL;
    ch_config_table_t t = ch_train_output_config_table();
    assert_string_equal(t.title, "output");
    assert_ch_ok(ch_config_load_tables(&t, 1, NULL, 4, argv, &cfg));
    ch_train_output_options_t o;
    assert_ch_ok(ch_train_output_options_from_config(cfg, &o));
    assert_string_equal(o.dir, dir);
    assert_int_equal(o.save_every, 2);
    assert_string_equal(o.resume, "");
    /* model files: every 2nd epoch and the last */
    assert_false(ch_train_output_saves_model(&o, 0, 5));
    assert_true(ch_train_output_saves_model(&o, 1, 5));
    assert_false(ch_train_output_saves_model(&o, 2, 5));
    assert_true(ch_train_output_saves_model(&o, 4, 5));
    char buf[1100];
    const char *src = NULL;
    assert_ch_ok(ch_train_output_model_path(&o, 3, buf, sizeof buf));
    assert_string_equal(buf, path_in("model-3.safetensors"));
    assert_ch_error(ch_train_output_model_path(&o, 3, buf, 8), CH_ERR_RANGE, "output.dir");
    /* resume: "" none, auto without file none, auto with file it, a path */
    assert_ch_ok(ch_train_output_resume_source(&o, buf, sizeof buf, &src));
    assert_null(src);
    o.resume = "auto";
    assert_ch_ok(ch_train_output_resume_source(&o, buf, sizeof buf, &src));
    assert_null(src);
    FILE *f = fopen(path_in("resume.safetensors"), "w");
    assert_non_null(f);
    fclose(f);
    assert_ch_ok(ch_train_output_resume_source(&o, buf, sizeof buf, &src));
    assert_non_null(src);
    assert_string_equal(src, path_in("resume.safetensors"));
    o.resume = "/nonexistent/r.safetensors";
    assert_ch_error(ch_train_output_resume_source(&o, buf, sizeof buf, &src), CH_ERR_IO,
                    "output.resume: '/nonexistent/r.safetensors' not found");
    ch_config_destroy(cfg);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_model_file_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_errors, setup, teardown),
        cmocka_unit_test(test_resume_check),
        cmocka_unit_test_setup_teardown(test_pretrained_exact_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pretrained_skips_other_classes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pretrained_module_prefix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pretrained_mixed_prefix_not_stripped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pretrained_refuses_wrong_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pretrained_from_resume_file, setup, teardown),
        cmocka_unit_test(test_pretrained_pytorch_ddp_file),
        cmocka_unit_test_setup_teardown(test_output_options, setup, teardown),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
