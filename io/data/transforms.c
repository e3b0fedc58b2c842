/* cohort: image transforms, see transforms.h. */
#include "io/data/transforms.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ch_transforms {
    ch_transform_t ops[CH_TRANSFORMS_MAX];
    int n;
    int channels;
    uint64_t seed;
    float lut[3][256]; /* Normalize(ToTensor(v)) per channel */
};

/* ------------------------------------------------------------ randomness */

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_init(rng_t *r, uint64_t seed, int64_t epoch, int64_t index)
{
    uint64_t s = mix64(seed ^ 0x6a09e667f3bcc909ull);
    s = mix64(s ^ ((uint64_t)epoch * 0x9e3779b97f4a7c15ull + 0xbb67ae8584caa73bull));
    s = mix64(s ^ ((uint64_t)index * 0xd1b54a32d192ed03ull + 0x3c6ef372fe94f82bull));
    r->s = s;
}

static uint64_t rng_next(rng_t *r)
{
    r->s += 0x9e3779b97f4a7c15ull;
    return mix64(r->s);
}

/* uniform in [0, 1) with 53 bits */
static double rng_uniform(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

/* uniform integer in [0, n), n >= 1 */
static int64_t rng_below(rng_t *r, int64_t n)
{
    return (int64_t)(((unsigned __int128)rng_next(r) * (uint64_t)n) >> 64);
}

/* ------------------------------------------------------------ ops */

ch_transform_t ch_tf_random_crop(int size, int padding)
{
    ch_transform_t t = {.kind = CH_TF_RANDOM_CROP, .size = {size, size}, .padding = padding};
    return t;
}
ch_transform_t ch_tf_random_hflip(double p)
{
    ch_transform_t t = {.kind = CH_TF_RANDOM_HFLIP, .p = p};
    return t;
}
ch_transform_t ch_tf_resize(int shorter_side)
{
    ch_transform_t t = {.kind = CH_TF_RESIZE, .size = {shorter_side, 0}};
    return t;
}
ch_transform_t ch_tf_resize_hw(int h, int w)
{
    ch_transform_t t = {.kind = CH_TF_RESIZE, .size = {h, w}};
    return t;
}
ch_transform_t ch_tf_center_crop(int size)
{
    ch_transform_t t = {.kind = CH_TF_CENTER_CROP, .size = {size, size}};
    return t;
}
ch_transform_t ch_tf_random_resized_crop(int size)
{
    ch_transform_t t = {.kind = CH_TF_RANDOM_RESIZED_CROP,
                        .size = {size, size},
                        .scale = {0.08, 1.0},
                        .ratio = {3.0 / 4.0, 4.0 / 3.0}};
    return t;
}
ch_transform_t ch_tf_normalize(int channels, const float *mean, const float *std)
{
    ch_transform_t t = {.kind = CH_TF_NORMALIZE};
    for (int c = 0; c < 3; c++) {
        t.mean[c] = mean ? mean[c < channels ? c : 0] : 0.0f;
        t.std[c] = std ? std[c < channels ? c : 0] : 1.0f;
    }
    return t;
}

ch_status ch_transforms_create(const ch_transform_t *ops, int n,
                               int channels, uint64_t seed, ch_transforms_t **out)
{
    *out = NULL;
    CH_REQUIRE(n >= 1 && n <= CH_TRANSFORMS_MAX, "transforms: %d ops (1..%d allowed)", n,
               CH_TRANSFORMS_MAX);
    CH_REQUIRE(channels == 1 || channels == 3, "transforms: channels %d (expected 1 or 3)", channels);
    for (int k = 0; k < n; k++) {
        const ch_transform_t *t = &ops[k];
        switch (t->kind) {
        case CH_TF_RANDOM_CROP:
            CH_REQUIRE(t->size[0] > 0 && t->size[1] > 0 && t->padding >= 0,
                       "transforms: RandomCrop size %dx%d padding %d", t->size[0], t->size[1],
                       t->padding);
            break;
        case CH_TF_RANDOM_HFLIP:
            CH_REQUIRE(t->p >= 0.0 && t->p <= 1.0, "transforms: RandomHorizontalFlip p=%g", t->p);
            break;
        case CH_TF_RESIZE:
            CH_REQUIRE(t->size[0] > 0 && t->size[1] >= 0, "transforms: Resize size %d,%d",
                       t->size[0], t->size[1]);
            break;
        case CH_TF_CENTER_CROP:
            CH_REQUIRE(t->size[0] > 0 && t->size[1] > 0, "transforms: CenterCrop size %dx%d",
                       t->size[0], t->size[1]);
            break;
        case CH_TF_RANDOM_RESIZED_CROP:
            CH_REQUIRE(t->size[0] > 0 && t->size[1] > 0 && t->scale[0] > 0 &&
                           t->scale[0] <= t->scale[1] && t->ratio[0] > 0 &&
                           t->ratio[0] <= t->ratio[1],
                       "transforms: RandomResizedCrop size %dx%d scale (%g, %g) ratio (%g, %g)",
                       t->size[0], t->size[1], t->scale[0], t->scale[1], t->ratio[0], t->ratio[1]);
            break;
        case CH_TF_NORMALIZE:
            CH_REQUIRE(k == n - 1, "transforms: Normalize (ToTensor) must be the last op, it is op %d of %d",
                       k + 1, n);
            for (int c = 0; c < channels; c++)
                CH_REQUIRE(t->std[c] != 0.0f, "transforms: Normalize std[%d] is 0", c);
            break;
        default:
            return CH_ERROR(CH_ERR_INVALID, "transforms: unknown op kind %d", (int)t->kind);
        }
    }
    CH_REQUIRE(ops[n - 1].kind == CH_TF_NORMALIZE,
               "transforms: the list must end with Normalize (ToTensor + Normalize)");
    ch_transforms_t *tf = calloc(1, sizeof *tf);
    if (!tf) return CH_ERROR(CH_ERR_NOMEM, "transforms: out of memory");
    memcpy(tf->ops, ops, (size_t)n * sizeof *ops);
    tf->n = n;
    tf->channels = channels;
    tf->seed = seed;
    const ch_transform_t *nm = &ops[n - 1];
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++) {
            /* torchvision: ToTensor = float(v).div(255); Normalize = sub_(mean).div_(std) */
            float x = (float)v / 255.0f;
            x = x - nm->mean[c];
            x = x / nm->std[c];
            tf->lut[c][v] = x;
        }
    *out = tf;
    return CH_OK;
}

void ch_transforms_destroy(ch_transforms_t *tf) { free(tf); }

static void resize_size(const ch_transform_t *t, int h, int w, int *oh, int *ow)
{
    if (t->size[1] > 0) {
        *oh = t->size[0];
        *ow = t->size[1];
        return;
    }
    int s = t->size[0];
    if (h == 0 || w == 0) { /* unknown input size */
        *oh = *ow = 0;
        return;
    }
    /* torchvision _compute_resized_output_size */
    int shorter = w <= h ? w : h, longer = w <= h ? h : w;
    int nl = (int)((double)((int64_t)s * longer) / (double)shorter);
    if (w <= h) {
        *ow = s;
        *oh = nl;
    } else {
        *oh = s;
        *ow = nl;
    }
}

void ch_transforms_output_size(const ch_transforms_t *tf, int in_h, int in_w, int *out_h,
                               int *out_w)
{
    int h = in_h, w = in_w;
    for (int k = 0; k < tf->n; k++) {
        const ch_transform_t *t = &tf->ops[k];
        switch (t->kind) {
        case CH_TF_RANDOM_CROP:
        case CH_TF_CENTER_CROP:
        case CH_TF_RANDOM_RESIZED_CROP:
            h = t->size[0];
            w = t->size[1];
            break;
        case CH_TF_RESIZE:
            resize_size(t, h, w, &h, &w);
            break;
        default:
            break;
        }
    }
    *out_h = h;
    *out_w = w;
}

void ch_transforms_scratch_init(ch_transforms_scratch_t *s) { memset(s, 0, sizeof *s); }

void ch_transforms_scratch_free(ch_transforms_scratch_t *s)
{
    ch_image_free(&s->a);
    ch_image_free(&s->b);
    ch_resample_scratch_free(&s->rs);
}

/* ------------------------------------------------------------ views */

/* A lazy crop / pad / flip of a base image: pixel (y, x) of the view is
 * base pixel (y0 + y, flip ? x0 + w - 1 - x : x0 + x) if that lies in the
 * valid rectangle [vx0, vx1) x [vy0, vy1), else 0 (padding). */
struct view {
    const uint8_t *base;
    const ch_image_t *img; /* owner of base */
    int bh, bw, c;
    int x0, y0, w, h;
    int flip;
    int vx0, vy0, vx1, vy1;
};

static void view_of(struct view *v, const ch_image_t *img)
{
    v->base = img->data;
    v->img = img;
    v->bh = img->h;
    v->bw = img->w;
    v->c = img->c;
    v->x0 = v->y0 = 0;
    v->w = img->w;
    v->h = img->h;
    v->flip = 0;
    v->vx0 = v->vy0 = 0;
    v->vx1 = img->w;
    v->vy1 = img->h;
}

static int imax(int a, int b) { return a > b ? a : b; }
static int imin(int a, int b) { return a < b ? a : b; }

/* Crop rows [cy, cy+ch) and columns [cx, cx+cw) of the view (may reach
 * outside it: the outside is padding). */
static void view_crop(struct view *v, int cy, int cx, int ch, int cw)
{
    v->vx0 = imax(v->vx0, v->x0);
    v->vy0 = imax(v->vy0, v->y0);
    v->vx1 = imin(v->vx1, v->x0 + v->w);
    v->vy1 = imin(v->vy1, v->y0 + v->h);
    v->y0 += cy;
    v->x0 = v->flip ? v->x0 + v->w - cx - cw : v->x0 + cx;
    v->w = cw;
    v->h = ch;
}

static int view_inside(const struct view *v)
{
    return v->x0 >= v->vx0 && v->y0 >= v->vy0 && v->x0 + v->w <= v->vx1 && v->y0 + v->h <= v->vy1;
}

/* For output row y: the view's columns [*xa, *xb) map to valid pixels; base
 * row pointer and step. Returns 0 when the whole row is padding. */
static int view_row(const struct view *v, int y, int *xa, int *xb, const uint8_t **p0, long *step)
{
    int by = v->y0 + y;
    if (by < v->vy0 || by >= v->vy1) return 0;
    int a, b;
    if (!v->flip) { /* bx = x0 + x in [vx0, vx1) */
        a = v->vx0 - v->x0;
        b = v->vx1 - v->x0;
    } else { /* bx = x0 + w - 1 - x */
        a = v->x0 + v->w - v->vx1;
        b = v->x0 + v->w - v->vx0;
    }
    a = imax(a, 0);
    b = imin(b, v->w);
    if (a >= b) return 0;
    *xa = a;
    *xb = b;
    int bx = v->flip ? v->x0 + v->w - 1 - a : v->x0 + a;
    *p0 = v->base + ((size_t)by * (size_t)v->bw + (size_t)bx) * (size_t)v->c;
    *step = v->flip ? -(long)v->c : (long)v->c;
    return 1;
}

/* Copy the view into dst (h x w x c). */
static ch_status view_materialize(const struct view *v, ch_image_t *dst)
{
    CH_TRY(ch_image_reshape(dst, v->h, v->w, v->c));
    size_t rowb = (size_t)v->w * (size_t)v->c;
    for (int y = 0; y < v->h; y++) {
        uint8_t *o = dst->data + (size_t)y * rowb;
        int xa, xb;
        const uint8_t *p;
        long step;
        if (!view_row(v, y, &xa, &xb, &p, &step)) {
            memset(o, 0, rowb);
            continue;
        }
        memset(o, 0, (size_t)xa * (size_t)v->c);
        memset(o + (size_t)xb * (size_t)v->c, 0, (size_t)(v->w - xb) * (size_t)v->c);
        if (step > 0) {
            memcpy(o + (size_t)xa * (size_t)v->c, p, (size_t)(xb - xa) * (size_t)v->c);
        } else {
            for (int x = xa; x < xb; x++, p += step)
                for (int c = 0; c < v->c; c++) o[(size_t)x * (size_t)v->c + (size_t)c] = p[c];
        }
    }
    return CH_OK;
}

static ch_image_t *other(ch_transforms_scratch_t *s, const ch_image_t *img)
{
    return img == &s->a ? &s->b : &s->a;
}

/* Resize the view to oh x ow (PIL bilinear); the view becomes the result. */
static ch_status view_resize(struct view *v, int oh, int ow, ch_transforms_scratch_t *s)
{
    if (oh == v->h && ow == v->w && !v->flip && view_inside(v)) {
        /* torchvision returns the image unchanged when the size matches */
        return CH_OK;
    }
    const uint8_t *src;
    size_t stride;
    const ch_image_t *src_img;
    if (!v->flip && view_inside(v)) {
        src = v->base + ((size_t)v->y0 * (size_t)v->bw + (size_t)v->x0) * (size_t)v->c;
        stride = (size_t)v->bw * (size_t)v->c;
        src_img = v->img;
    } else {
        ch_image_t *m = other(s, v->img);
        CH_TRY(view_materialize(v, m));
        src = m->data;
        stride = (size_t)m->w * (size_t)m->c;
        src_img = m;
    }
    ch_image_t *dst = other(s, src_img);
    CH_TRY(ch_image_reshape(dst, oh, ow, v->c));
    CH_TRY(ch_resample_bilinear(src, v->h, v->w, v->c, stride, dst->data, oh, ow, &s->rs));
    view_of(v, dst);
    return CH_OK;
}

/* torchvision RandomResizedCrop.get_params */
static void rrc_params(const ch_transform_t *t, int height, int width, rng_t *r, int *i, int *j,
                       int *h, int *w)
{
    double area = (double)height * (double)width;
    double lr0 = log(t->ratio[0]), lr1 = log(t->ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (t->scale[0] + (t->scale[1] - t->scale[0]) * rng_uniform(r));
        double aspect = exp(lr0 + (lr1 - lr0) * rng_uniform(r));
        int cw = (int)nearbyint(sqrt(target * aspect));
        int chh = (int)nearbyint(sqrt(target / aspect));
        if (cw > 0 && cw <= width && chh > 0 && chh <= height) {
            *i = (int)rng_below(r, height - chh + 1);
            *j = (int)rng_below(r, width - cw + 1);
            *h = chh;
            *w = cw;
            return;
        }
    }
    double in_ratio = (double)width / (double)height;
    if (in_ratio < t->ratio[0]) {
        *w = width;
        *h = (int)nearbyint(*w / t->ratio[0]);
    } else if (in_ratio > t->ratio[1]) {
        *h = height;
        *w = (int)nearbyint(*h * t->ratio[1]);
    } else {
        *w = width;
        *h = height;
    }
    *i = (height - *h) / 2;
    *j = (width - *w) / 2;
}

/* ---------------------------------------------------- fast decode (ROI) */

/* Largest DCT scale used below 8/8: only crops that the resize shrinks by
 * 2x or more are decoded scaled (data.fast_decode). */
#define FAST_MAX_SCALE 4

int ch_transforms_fast_decode_ok(const ch_transforms_t *tf)
{
    return tf->n >= 2 &&
           (tf->ops[0].kind == CH_TF_RANDOM_RESIZED_CROP || tf->ops[0].kind == CH_TF_RESIZE);
}

/* The first op of a fast-decode pipeline on a full_h x full_w image: the
 * box (y, x, h, w) it reads in full-size pixels, its output (oh, ow), the
 * DCT scale n (1..8) and the region of the scaled image that covers the
 * box. Draws from r exactly as ch_transforms_apply does. */
struct fast_plan {
    int y, x, h, w, oh, ow, n;
    ch_image_roi_t roi;
};

static void fast_plan(const ch_transforms_t *tf, int full_h, int full_w, rng_t *r,
                      struct fast_plan *p)
{
    const ch_transform_t *t = &tf->ops[0];
    if (t->kind == CH_TF_RANDOM_RESIZED_CROP) {
        rrc_params(t, full_h, full_w, r, &p->y, &p->x, &p->h, &p->w);
        p->oh = t->size[0];
        p->ow = t->size[1];
    } else {
        p->y = p->x = 0;
        p->h = full_h;
        p->w = full_w;
        resize_size(t, full_h, full_w, &p->oh, &p->ow);
    }
    /* smallest n with the scaled box still >= the output on both axes */
    int n = 1;
    while (n < 8 && ((int64_t)p->h * n < (int64_t)8 * p->oh || (int64_t)p->w * n < (int64_t)8 * p->ow))
        n++;
    if (n > FAST_MAX_SCALE) n = 8;
    p->n = n;
    int sh = (int)(((int64_t)full_h * n + 7) / 8), sw = (int)(((int64_t)full_w * n + 7) / 8);
    int y0 = (int)floor(p->y * n / 8.0), x0 = (int)floor(p->x * n / 8.0);
    int y1 = (int)ceil((p->y + p->h) * n / 8.0), x1 = (int)ceil((p->x + p->w) * n / 8.0);
    if (y1 > sh) y1 = sh;
    if (x1 > sw) x1 = sw;
    p->roi.y = y0;
    p->roi.x = x0;
    p->roi.h = y1 - y0;
    p->roi.w = x1 - x0;
    p->roi.scale_num = n;
}

int ch_transforms_roi(void *ctx, int h, int w, ch_image_roi_t *roi)
{
    const ch_transforms_roi_ctx_t *c = ctx;
    if (!c || !c->tf || !ch_transforms_fast_decode_ok(c->tf) || h < 1 || w < 1) return 0;
    rng_t r;
    rng_init(&r, c->tf->seed, c->epoch, c->index);
    struct fast_plan p;
    fast_plan(c->tf, h, w, &r, &p);
    if (p.n == 8 && p.roi.h == h && p.roi.w == w) return 0; /* the whole image anyway */
    *roi = p.roi;
    return 1;
}

/* First op of the pipeline on a partially decoded image (ch_transforms_roi):
 * resize the scaled box to the op's output; v becomes the result. */
static ch_status apply_fast_first(const ch_transforms_t *tf, const ch_image_t *in, rng_t *r,
                                  ch_transforms_scratch_t *s, struct view *v)
{
    if (!ch_transforms_fast_decode_ok(tf))
        return CH_ERROR(CH_ERR_INVALID, "transforms: a partially decoded image (fast decode) needs "
                        "a pipeline that starts with RandomResizedCrop or Resize");
    struct fast_plan p;
    fast_plan(tf, in->full_h, in->full_w, r, &p);
    if (p.n != in->scale_num || p.roi.y != in->off_y || p.roi.x != in->off_x ||
        p.roi.h != in->h || p.roi.w != in->w)
        return CH_ERROR(CH_ERR_INTERNAL,
                        "transforms: the decoded region %dx%d at (%d, %d), scale %d/8, is not the "
                        "one planned (%dx%d at (%d, %d), scale %d/8): sample or epoch changed "
                        "between decode and transform",
                        in->h, in->w, in->off_y, in->off_x, in->scale_num, p.roi.h, p.roi.w,
                        p.roi.y, p.roi.x, p.n);
    double k = p.n / 8.0;
    const double box[4] = {p.x * k - in->off_x, p.y * k - in->off_y, (p.x + p.w) * k - in->off_x,
                           (p.y + p.h) * k - in->off_y};
    ch_image_t *dst = other(s, in);
    CH_TRY(ch_image_reshape(dst, p.oh, p.ow, in->c));
    CH_TRY(ch_resample_bilinear_box(in->data, in->h, in->w, in->c, (size_t)in->w * (size_t)in->c,
                                    box, dst->data, p.oh, p.ow, &s->rs));
    view_of(v, dst);
    if (tf->ops[0].kind == CH_TF_RANDOM_RESIZED_CROP) {
        s->rec.crop[0] = p.y;
        s->rec.crop[1] = p.x;
        s->rec.crop[2] = p.h;
        s->rec.crop[3] = p.w;
    }
    s->rec.scale_num = p.n;
    return CH_OK;
}

ch_status ch_transforms_apply(const ch_transforms_t *tf, const ch_image_t *in, int64_t epoch,
                              int64_t index, ch_transforms_scratch_t *s, float *out, int out_h,
                              int out_w)
{
    if (in->c != tf->channels)
        return CH_ERROR(CH_ERR_INVALID, "transforms: image has %d channels, the pipeline %d", in->c,
                        tf->channels);
    rng_t r;
    rng_init(&r, tf->seed, epoch, index);
    struct view v;
    memset(&v, 0, sizeof v);
    int k0 = 0;
    s->rec.crop[0] = s->rec.crop[1] = s->rec.crop[2] = s->rec.crop[3] = -1;
    s->rec.flip = 0;
    s->rec.scale_num = 8;
    if (!ch_image_is_full(in)) { /* fast decode: the first op reads the decoded region */
        CH_TRY(apply_fast_first(tf, in, &r, s, &v));
        k0 = 1;
    } else {
        view_of(&v, in);
    }
    for (int k = k0; k < tf->n - 1; k++) {
        const ch_transform_t *t = &tf->ops[k];
        switch (t->kind) {
        case CH_TF_RANDOM_CROP: {
            int ph = v.h + 2 * t->padding, pw = v.w + 2 * t->padding;
            int th = t->size[0], tw = t->size[1];
            if (ph < th || pw < tw)
                return CH_ERROR(CH_ERR_RANGE,
                                "RandomCrop: required crop size (%d, %d) is larger than the padded "
                                "image size (%d, %d)",
                                th, tw, ph, pw);
            int i = 0, j = 0;
            if (!(ph == th && pw == tw)) {
                i = (int)rng_below(&r, ph - th + 1);
                j = (int)rng_below(&r, pw - tw + 1);
            }
            view_crop(&v, i - t->padding, j - t->padding, th, tw);
            break;
        }
        case CH_TF_RANDOM_HFLIP:
            if (rng_uniform(&r) < t->p) {
                v.flip = !v.flip;
                s->rec.flip++;
            }
            break;
        case CH_TF_RESIZE: {
            int oh, ow;
            resize_size(t, v.h, v.w, &oh, &ow);
            CH_TRY(view_resize(&v, oh, ow, s));
            break;
        }
        case CH_TF_CENTER_CROP: {
            int ch = t->size[0], cw = t->size[1];
            int ih = v.h, iw = v.w, top = 0, left = 0;
            if (cw > iw || ch > ih) {
                int pl = cw > iw ? (cw - iw) / 2 : 0, pt = ch > ih ? (ch - ih) / 2 : 0;
                int pr = cw > iw ? (cw - iw + 1) / 2 : 0, pb = ch > ih ? (ch - ih + 1) / 2 : 0;
                top = -pt;
                left = -pl;
                ih += pt + pb;
                iw += pl + pr;
            }
            top += (int)nearbyint((ih - ch) / 2.0);
            left += (int)nearbyint((iw - cw) / 2.0);
            view_crop(&v, top, left, ch, cw);
            break;
        }
        case CH_TF_RANDOM_RESIZED_CROP: {
            int i, j, h, w;
            rrc_params(t, v.h, v.w, &r, &i, &j, &h, &w);
            s->rec.crop[0] = i;
            s->rec.crop[1] = j;
            s->rec.crop[2] = h;
            s->rec.crop[3] = w;
            view_crop(&v, i, j, h, w);
            CH_TRY(view_resize(&v, t->size[0], t->size[1], s));
            break;
        }
        default:
            break;
        }
    }
    if (v.h != out_h || v.w != out_w)
        return CH_ERROR(CH_ERR_RANGE, "transforms: result is %dx%d, the batch expects %dx%d "
                        "(end the list with a crop or a fixed-size Resize)",
                        v.h, v.w, out_h, out_w);
    /* ToTensor + Normalize into C,H,W */
    size_t plane = (size_t)out_h * (size_t)out_w;
    int C = tf->channels;
    for (int y = 0; y < out_h; y++) {
        int xa = 0, xb = 0;
        const uint8_t *p = NULL;
        long step = 0;
        int any = view_row(&v, y, &xa, &xb, &p, &step);
        for (int c = 0; c < C; c++) {
            float *o = out + (size_t)c * plane + (size_t)y * (size_t)out_w;
            const float *lut = tf->lut[c];
            float pad = lut[0];
            if (!any) {
                for (int x = 0; x < out_w; x++) o[x] = pad;
                continue;
            }
            for (int x = 0; x < xa; x++) o[x] = pad;
            const uint8_t *q = p + c;
            if (C == 1 && step == 1) {
                for (int x = xa; x < xb; x++) o[x] = lut[q[x - xa]];
            } else {
                for (int x = xa; x < xb; x++, q += step) o[x] = lut[*q];
            }
            for (int x = xb; x < out_w; x++) o[x] = pad;
        }
    }
    return CH_OK;
}

/* ------------------------------------------------------------ parsing */

typedef struct {
    const char *s, *p;
} parser_t;

static void skip_ws(parser_t *ps)
{
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r') ps->p++;
}

#define PARSE_MAX_VALUES 8

/* value: number or [n, n, ...] / (n, ...); returns the count (>= 1) or -1 */
static int parse_value(parser_t *ps, double *v)
{
    skip_ws(ps);
    char open = *ps->p;
    if (open == '[' || open == '(') {
        char close = open == '[' ? ']' : ')';
        ps->p++;
        int k = 0;
        for (;;) {
            skip_ws(ps);
            char *end;
            double x = strtod(ps->p, &end);
            if (end == ps->p || k >= PARSE_MAX_VALUES) return -1;
            v[k++] = x;
            ps->p = end;
            skip_ws(ps);
            if (*ps->p == ',') {
                ps->p++;
                continue;
            }
            if (*ps->p != close) return -1;
            ps->p++;
            return k;
        }
    }
    char *end;
    v[0] = strtod(ps->p, &end);
    if (end == ps->p) return -1;
    ps->p = end;
    return 1;
}

struct parsed_arg {
    char key[32]; /* "" when positional */
    double v[PARSE_MAX_VALUES];
    int n;
};

#define PERR(ps, ...)                                                                      \
    CH_ERROR(CH_ERR_CONFIG, "transforms \"%s\" at character %d: %s", (ps)->s,              \
             (int)((ps)->p - (ps)->s) + 1, (snprintf(msgbuf, sizeof msgbuf, __VA_ARGS__), msgbuf))

static int arg_int(const struct parsed_arg *a, int k) { return (int)a->v[k]; }

ch_status ch_transforms_parse(const char *spec, int channels, ch_transform_t *ops, int max_ops,
                              int *n)
{
    char msgbuf[1024];
    CH_REQUIRE(spec != NULL && ops != NULL && n != NULL && max_ops >= 1,
               "ch_transforms_parse: bad arguments");
    CH_REQUIRE(channels == 1 || channels == 3, "transforms: channels %d (expected 1 or 3)", channels);
    parser_t ps = {spec, spec};
    int count = 0, saw_to_tensor = 0;
    *n = 0;
    for (;;) {
        skip_ws(&ps);
        if (!*ps.p) break;
        char name[32];
        int ln = 0;
        while ((*ps.p >= 'a' && *ps.p <= 'z') || *ps.p == '_' || (*ps.p >= 'A' && *ps.p <= 'Z')) {
            if (ln < 31) name[ln++] = (char)(*ps.p >= 'A' && *ps.p <= 'Z' ? *ps.p - 'A' + 'a' : *ps.p);
            ps.p++;
        }
        name[ln] = 0;
        if (!ln) return PERR(&ps, "expected a transform name");
        skip_ws(&ps);
        struct parsed_arg args[6];
        int nargs = 0;
        if (*ps.p == '(') {
            ps.p++;
            skip_ws(&ps);
            while (*ps.p && *ps.p != ')') {
                if (nargs == 6) return PERR(&ps, "%s: too many arguments", name);
                struct parsed_arg *a = &args[nargs];
                a->key[0] = 0;
                const char *save = ps.p;
                int lk = 0;
                while ((*ps.p >= 'a' && *ps.p <= 'z') || *ps.p == '_') {
                    if (lk < 31) a->key[lk++] = *ps.p;
                    ps.p++;
                }
                a->key[lk] = 0;
                skip_ws(&ps);
                if (lk && *ps.p == '=') {
                    ps.p++;
                } else {
                    ps.p = save;
                    a->key[0] = 0;
                }
                a->n = parse_value(&ps, a->v);
                if (a->n < 0) return PERR(&ps, "%s: expected a number or a list of numbers", name);
                nargs++;
                skip_ws(&ps);
                if (*ps.p == ',') {
                    ps.p++;
                    skip_ws(&ps);
                }
            }
            if (*ps.p != ')') return PERR(&ps, "%s: missing ')'", name);
            ps.p++;
        }
        skip_ws(&ps);
        if (*ps.p == ';') ps.p++;
        else if (*ps.p) return PERR(&ps, "expected ';' after %s(...)", name);
        if (saw_to_tensor && strcmp(name, "normalize") != 0)
            return PERR(&ps, "%s after to_tensor(): only normalize may follow it", name);
        /* look up named / positional arguments */
        const char *keys[4] = {0};
        int nkeys = 0;
        ch_transform_t t;
        memset(&t, 0, sizeof t);
        if (!strcmp(name, "random_crop")) {
            t.kind = CH_TF_RANDOM_CROP;
            keys[0] = "size", keys[1] = "padding", nkeys = 2;
        } else if (!strcmp(name, "random_horizontal_flip") || !strcmp(name, "hflip")) {
            t.kind = CH_TF_RANDOM_HFLIP;
            t.p = 0.5;
            keys[0] = "p", nkeys = 1;
        } else if (!strcmp(name, "resize")) {
            t.kind = CH_TF_RESIZE;
            keys[0] = "size", nkeys = 1;
        } else if (!strcmp(name, "center_crop")) {
            t.kind = CH_TF_CENTER_CROP;
            keys[0] = "size", nkeys = 1;
        } else if (!strcmp(name, "random_resized_crop")) {
            t = ch_tf_random_resized_crop(1);
            keys[0] = "size", keys[1] = "scale", keys[2] = "ratio", nkeys = 3;
        } else if (!strcmp(name, "to_tensor")) {
            if (nargs) return PERR(&ps, "to_tensor() takes no arguments");
            saw_to_tensor = 1;
            continue;
        } else if (!strcmp(name, "normalize")) {
            t = ch_tf_normalize(channels, NULL, NULL);
            keys[0] = "mean", keys[1] = "std", nkeys = 2;
        } else {
            return PERR(&ps, "unknown transform '%s' (random_crop, random_horizontal_flip, resize, "
                             "center_crop, random_resized_crop, to_tensor, normalize)",
                        name);
        }
        int have_size = 0;
        for (int k = 0; k < nargs; k++) {
            int slot = -1;
            if (args[k].key[0]) {
                for (int j = 0; j < nkeys; j++)
                    if (!strcmp(args[k].key, keys[j])) slot = j;
                if (slot < 0) return PERR(&ps, "%s: unknown argument '%s'", name, args[k].key);
            } else {
                slot = k;
                if (slot >= nkeys) return PERR(&ps, "%s: too many arguments", name);
            }
            const struct parsed_arg *a = &args[k];
            const char *key = keys[slot];
            if (!strcmp(key, "size")) {
                if (a->n > 2) return PERR(&ps, "%s: size takes 1 or 2 values", name);
                t.size[0] = arg_int(a, 0);
                t.size[1] = a->n == 2 ? arg_int(a, 1) : (t.kind == CH_TF_RESIZE ? 0 : arg_int(a, 0));
                have_size = 1;
            } else if (!strcmp(key, "padding")) {
                if (a->n != 1) return PERR(&ps, "%s: padding takes 1 value", name);
                t.padding = arg_int(a, 0);
            } else if (!strcmp(key, "p")) {
                if (a->n != 1) return PERR(&ps, "%s: p takes 1 value", name);
                t.p = a->v[0];
            } else if (!strcmp(key, "scale") || !strcmp(key, "ratio")) {
                if (a->n != 2) return PERR(&ps, "%s: %s takes 2 values", name, key);
                double *dst = !strcmp(key, "scale") ? t.scale : t.ratio;
                dst[0] = a->v[0];
                dst[1] = a->v[1];
            } else { /* mean, std */
                if (a->n != 1 && a->n != channels)
                    return PERR(&ps, "%s: %s takes 1 or %d values, got %d", name, key, channels, a->n);
                float *dst = !strcmp(key, "mean") ? t.mean : t.std;
                for (int c = 0; c < 3; c++) dst[c] = (float)a->v[a->n == 1 ? 0 : (c < a->n ? c : 0)];
            }
        }
        if ((t.kind == CH_TF_RANDOM_CROP || t.kind == CH_TF_RESIZE || t.kind == CH_TF_CENTER_CROP ||
             t.kind == CH_TF_RANDOM_RESIZED_CROP) &&
            !have_size)
            return PERR(&ps, "%s: size is required", name);
        if (count == max_ops) return PERR(&ps, "more than %d transforms", max_ops);
        ops[count++] = t;
    }
    if (count == 0 || ops[count - 1].kind != CH_TF_NORMALIZE) {
        if (!saw_to_tensor && count > 0 && ops[count - 1].kind != CH_TF_NORMALIZE)
            return PERR(&ps, "the list must end with to_tensor() or normalize(...)");
        if (count == max_ops) return PERR(&ps, "more than %d transforms", max_ops);
        ops[count++] = ch_tf_normalize(channels, NULL, NULL);
    }
    *n = count;
    return CH_OK;
}
