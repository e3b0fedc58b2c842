/* cohort: torchvision ResNets, a small CNN and the registry of a program's own networks
 * (models.h). */
#include "config.h"

#include "models/models.h"

#include <stdio.h>
#include <string.h>

void ch_model_options_default(ch_model_options_t *o)
{
    o->num_classes = 1000;
    o->in_channels = 3;
    o->seed = 0;
}

/* torchvision.models.resnet.BasicBlock (expansion 1). */
static ch_status basic_block(ch_module_t *layer, const char *name, int inplanes, int planes,
                             int stride)
{
    ch_module_t *b, *conv1, *bn1, *relu, *conv2, *bn2, *ds = NULL;
    CH_TRY(ch_nn_residual(layer, name, &b));
    CH_TRY(ch_nn_conv2d(b, "conv1", inplanes, planes, 3, stride, 1, 0, &conv1));
    CH_TRY(ch_nn_batchnorm2d(b, "bn1", planes, &bn1));
    CH_TRY(ch_nn_relu(b, "relu", &relu));
    CH_TRY(ch_nn_conv2d(b, "conv2", planes, planes, 3, 1, 1, 0, &conv2));
    CH_TRY(ch_nn_batchnorm2d(b, "bn2", planes, &bn2));
    if (stride != 1 || inplanes != planes) {
        CH_TRY(ch_nn_sequential(b, "downsample", &ds));
        CH_TRY(ch_nn_conv2d(ds, "0", inplanes, planes, 1, stride, 0, 0, NULL));
        CH_TRY(ch_nn_batchnorm2d(ds, "1", planes, NULL));
    }
    ch_module_t *path[] = {conv1, bn1, relu, conv2, bn2};
    return ch_nn_residual_set_path(b, path, 5, ds, relu);
}

/* torchvision.models.resnet.Bottleneck (expansion 4, stride on conv2). */
static ch_status bottleneck(ch_module_t *layer, const char *name, int inplanes, int planes,
                            int stride)
{
    const int width = planes, outc = planes * 4;
    ch_module_t *b, *c1, *b1, *c2, *b2, *c3, *b3, *relu, *ds = NULL;
    CH_TRY(ch_nn_residual(layer, name, &b));
    CH_TRY(ch_nn_conv2d(b, "conv1", inplanes, width, 1, 1, 0, 0, &c1));
    CH_TRY(ch_nn_batchnorm2d(b, "bn1", width, &b1));
    CH_TRY(ch_nn_conv2d(b, "conv2", width, width, 3, stride, 1, 0, &c2));
    CH_TRY(ch_nn_batchnorm2d(b, "bn2", width, &b2));
    CH_TRY(ch_nn_conv2d(b, "conv3", width, outc, 1, 1, 0, 0, &c3));
    CH_TRY(ch_nn_batchnorm2d(b, "bn3", outc, &b3));
    CH_TRY(ch_nn_relu(b, "relu", &relu));
    if (stride != 1 || inplanes != outc) {
        CH_TRY(ch_nn_sequential(b, "downsample", &ds));
        CH_TRY(ch_nn_conv2d(ds, "0", inplanes, outc, 1, stride, 0, 0, NULL));
        CH_TRY(ch_nn_batchnorm2d(ds, "1", outc, NULL));
    }
    ch_module_t *path[] = {c1, b1, relu, c2, b2, relu, c3, b3};
    return ch_nn_residual_set_path(b, path, 8, ds, relu);
}

static ch_status build_resnet(ch_model_t *M, int bottle, const int blocks[4],
                              const ch_model_options_t *o)
{
    ch_module_t *root = ch_model_root(M);
    const int expansion = bottle ? 4 : 1;
    CH_TRY(ch_nn_conv2d(root, "conv1", o->in_channels, 64, 7, 2, 3, 0, NULL));
    CH_TRY(ch_nn_batchnorm2d(root, "bn1", 64, NULL));
    CH_TRY(ch_nn_relu(root, "relu", NULL));
    CH_TRY(ch_nn_maxpool2d(root, "maxpool", 3, 2, 1, NULL));
    int inplanes = 64;
    for (int l = 0; l < 4; l++) {
        const int planes = 64 << l, stride = l == 0 ? 1 : 2;
        char lname[16];
        snprintf(lname, sizeof lname, "layer%d", l + 1);
        ch_module_t *layer;
        CH_TRY(ch_nn_sequential(root, lname, &layer));
        for (int i = 0; i < blocks[l]; i++) {
            char bname[16];
            snprintf(bname, sizeof bname, "%d", i);
            int s = i == 0 ? stride : 1;
            if (bottle) CH_TRY(bottleneck(layer, bname, inplanes, planes, s));
            else CH_TRY(basic_block(layer, bname, inplanes, planes, s));
            inplanes = planes * expansion;
        }
    }
    CH_TRY(ch_nn_adaptive_avgpool2d(root, "avgpool", NULL));
    return ch_nn_linear(root, "fc", 512 * expansion, o->num_classes, 1, NULL);
}

static ch_status build_smallcnn(ch_model_t *M, const ch_model_options_t *o)
{
    ch_module_t *root = ch_model_root(M);
    CH_TRY(ch_nn_conv2d(root, "conv1", o->in_channels, 16, 3, 1, 1, 0, NULL));
    CH_TRY(ch_nn_batchnorm2d(root, "bn1", 16, NULL));
    CH_TRY(ch_nn_relu(root, "relu", NULL));
    CH_TRY(ch_nn_conv2d(root, "conv2", 16, 32, 3, 2, 1, 0, NULL));
    CH_TRY(ch_nn_batchnorm2d(root, "bn2", 32, NULL));
    CH_TRY(ch_nn_relu(root, "relu2", NULL));
    CH_TRY(ch_nn_adaptive_avgpool2d(root, "avgpool", NULL));
    return ch_nn_linear(root, "fc", 32, o->num_classes, 1, NULL);
}

enum { N_BUILTIN = 4 };
/* built-in names, then the registered ones; NULL-terminated */
static const char *names[N_BUILTIN + CH_MODEL_MAX_REGISTERED + 1] = {"resnet18", "resnet34",
                                                                     "resnet50", "smallcnn"};
static struct {
    char name[64];
    ch_model_builder_fn fn;
    void *arg;
} registered[CH_MODEL_MAX_REGISTERED];
static int n_registered;

const char *const *ch_model_names(void) { return names; }

static int find_name(const char *name)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return i;
    return -1;
}

ch_status ch_model_register(const char *name, ch_model_builder_fn builder, void *arg)
{
    CH_REQUIRE(name && builder, "ch_model_register: NULL %s", name ? "builder" : "name");
    size_t len = strlen(name);
    int ok = len > 0 && len < sizeof registered[0].name;
    for (size_t i = 0; ok && i < len; i++)
        ok = (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') ||
             (name[i] >= '0' && name[i] <= '9') || strchr("_-.", name[i]);
    CH_REQUIRE(ok, "ch_model_register: model name '%s': expected 1 to %d letters, digits, '_', "
               "'-' or '.'", name, (int)sizeof registered[0].name - 1);
    CH_REQUIRE(find_name(name) < 0, "ch_model_register: model name '%s' is already taken", name);
    if (n_registered == CH_MODEL_MAX_REGISTERED)
        return CH_ERROR(CH_ERR_RANGE, "ch_model_register: '%s': at most %d models can be "
                        "registered", name, CH_MODEL_MAX_REGISTERED);
    snprintf(registered[n_registered].name, sizeof registered[0].name, "%s", name);
    registered[n_registered].fn = builder;
    registered[n_registered].arg = arg;
    names[N_BUILTIN + n_registered] = registered[n_registered].name;
    n_registered++;
    names[N_BUILTIN + n_registered] = NULL;
    return CH_OK;
}

/* "a, b, c" of the known names */
static void known_names(char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; names[i] && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? ", " : "", names[i]);
}

ch_status ch_model_create(const char *name, const ch_model_options_t *opts, ch_model_t **out)
{
    CH_REQUIRE(name && out, "ch_model_create: NULL argument");
    *out = NULL;
    ch_model_options_t o;
    if (opts) o = *opts;
    else ch_model_options_default(&o);
    CH_REQUIRE(o.num_classes >= 1, "model '%s': num_classes = %d, expected >= 1", name, o.num_classes);
    CH_REQUIRE(o.in_channels >= 1, "model '%s': in_channels = %d, expected >= 1", name, o.in_channels);
    static const int b18[4] = {2, 2, 2, 2}, b34[4] = {3, 4, 6, 3};
    int kind = find_name(name);
    if (kind < 0) {
        char known[1024];
        known_names(known, sizeof known);
        return CH_ERROR(CH_ERR_INVALID, "unknown model architecture '%s' (known: %s)", name, known);
    }
    ch_model_t *M;
    CH_TRY(ch_model_new(name, &M));
    ch_status s;
    switch (kind) {
    case 0: s = build_resnet(M, 0, b18, &o); break;
    case 1: s = build_resnet(M, 0, b34, &o); break;
    case 2: s = build_resnet(M, 1, b34, &o); break;
    case 3: s = build_smallcnn(M, &o); break;
    default: s = registered[kind - N_BUILTIN].fn(ch_model_root(M), &o,
                                                 registered[kind - N_BUILTIN].arg); break;
    }
    /* torchvision's ResNet init for the built-in networks, PyTorch's
     * module defaults for registered ones */
    if (s == CH_OK)
        s = ch_model_finalize_init(M, kind < N_BUILTIN ? CH_NN_INIT_RESNET : CH_NN_INIT_DEFAULT,
                                   o.seed);
    if (s != CH_OK) {
        ch_model_destroy(M);
        return ch_error_context("creating model '%s'", name);
    }
    *out = M;
    return CH_OK;
}
