/* cohort: images and JPEG/PNG decoding, see image.h. */
#include "io/data/image.h"

#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

void ch_image_init(ch_image_t *img) { memset(img, 0, sizeof *img); }

void ch_image_free(ch_image_t *img)
{
    if (!img) return;
    free(img->data);
    free(img->raw);
    memset(img, 0, sizeof *img);
}

ch_status ch_image_reshape(ch_image_t *img, int h, int w, int c)
{
    CH_REQUIRE(h > 0 && w > 0 && (c == 1 || c == 3) && h <= CH_IMAGE_MAX_SIDE &&
                   w <= CH_IMAGE_MAX_SIDE && (long)h * w <= CH_IMAGE_MAX_PIXELS,
               "image: bad dimensions %dx%dx%d (HxWxC; at most %ld pixels, C 1 or 3)", h, w, c,
               (long)CH_IMAGE_MAX_PIXELS);
    size_t need = (size_t)h * (size_t)w * (size_t)c;
    if (need > img->capacity) {
        uint8_t *p = realloc(img->data, need);
        if (!p) return CH_ERROR(CH_ERR_NOMEM, "image: out of memory for %zu bytes", need);
        img->data = p;
        img->capacity = need;
    }
    img->h = h;
    img->w = w;
    img->c = c;
    img->full_h = h; /* whole, full resolution (a partial decode sets these after) */
    img->full_w = w;
    img->scale_num = 8;
    img->off_y = img->off_x = 0;
    return CH_OK;
}

ch_status ch_image_reserve_raw(ch_image_t *img, size_t bytes)
{
    if (bytes > img->raw_capacity) {
        uint8_t *p = realloc(img->raw, bytes);
        if (!p) return CH_ERROR(CH_ERR_NOMEM, "image: out of memory for %zu bytes", bytes);
        img->raw = p;
        img->raw_capacity = bytes;
    }
    return CH_OK;
}

ch_status ch_image_read_file(ch_image_t *img, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return CH_ERROR(CH_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    ch_status st = CH_OK;
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        st = CH_ERROR(CH_ERR_IO, "'%s' is a directory, not a file", path);
        goto done;
    }
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = CH_ERROR(CH_ERR_IO, "cannot seek in '%s': %s", path, strerror(errno));
        goto done;
    }
    st = ch_image_reserve_raw(img, (size_t)size + 1);
    if (st) goto done;
    if (size > 0 && fread(img->raw, 1, (size_t)size, f) != (size_t)size) {
        st = CH_ERROR(CH_ERR_IO, "short read from '%s' (%ld bytes expected)", path, size);
        goto done;
    }
    img->raw_size = (size_t)size;
done:
    fclose(f);
    return st;
}

/* PIL's RGB -> L (Pillow Convert.c, L24), in place (dst may equal src). */
static void rgb_to_l(uint8_t *dst, const uint8_t *src, size_t npix)
{
    for (size_t i = 0; i < npix; i++) {
        const uint8_t *p = src + 3 * i;
        dst[i] = (uint8_t)(((uint32_t)p[0] * 19595u + (uint32_t)p[1] * 38470u +
                            (uint32_t)p[2] * 7471u + 0x8000u) >> 16);
    }
}

/* Gray row of w pixels at the start of row -> RGB, in place, back to front. */
static void gray_to_rgb_row(uint8_t *row, int w)
{
    for (int x = w - 1; x >= 0; x--) {
        uint8_t v = row[x];
        row[3 * x] = row[3 * x + 1] = row[3 * x + 2] = v;
    }
}

/* ------------------------------------------------------------------ JPEG */

struct jpeg_err {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    int eof;
    char msg[JMSG_LENGTH_MAX];
};

static void jpeg_err_exit(j_common_ptr c)
{
    struct jpeg_err *e = (struct jpeg_err *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jb, 1);
}

static void jpeg_err_emit(j_common_ptr c, int level)
{
    struct jpeg_err *e = (struct jpeg_err *)c->err;
    if (level < 0) {
        if (c->err->msg_code == JWRN_JPEG_EOF) e->eof = 1;
        c->err->num_warnings++;
    }
}

/* The region *roi of the JPEG whose header cinfo has read (decode_jpeg's
 * partial path, see ch_image_decode). Error exits longjmp to the caller's
 * setjmp in decode_jpeg; the caller destroys cinfo. */
static ch_status decode_jpeg_roi(j_decompress_ptr cinfo, struct jpeg_err *err, const uint8_t *buf,
                                 size_t len, const ch_image_roi_t *roi, int native, int channels,
                                 ch_image_t *img, const char *name)
{
    int h = (int)cinfo->image_height, w = (int)cinfo->image_width, n = roi->scale_num;
    if (n < 1 || n > 8)
        return CH_ERROR(CH_ERR_INVALID, "%s: JPEG region: scale %d/8 (1..8 expected)", name, n);
    /* libjpeg-turbo's scaled size: jdiv_round_up(size * scale_num, 8) */
    int sh = (int)(((long)h * n + 7) / 8), sw = (int)(((long)w * n + 7) / 8);
    if (roi->x < 0 || roi->y < 0 || roi->w < 1 || roi->h < 1 || roi->x + roi->w > sw ||
        roi->y + roi->h > sh)
        return CH_ERROR(CH_ERR_INVALID,
                        "%s: JPEG region %dx%d at (%d, %d) outside the %dx%d image (scale %d/8)",
                        name, roi->h, roi->w, roi->y, roi->x, sh, sw, n);
    cinfo->scale_num = (unsigned)n;
    cinfo->scale_denom = 8;
    jpeg_start_decompress(cinfo);
    if ((int)cinfo->output_components != native || (int)cinfo->output_width != sw ||
        (int)cinfo->output_height != sh)
        return CH_ERROR(CH_ERR_FORMAT, "%s: unexpected JPEG output %ux%ux%d (scale %d/8)", name,
                        cinfo->output_width, cinfo->output_height, cinfo->output_components, n);
    /* columns with a margin of 2: fancy upsampling treats the edges of a
     * partial row as image edges (libjpeg.txt, "Partial image decompression") */
    int x0 = roi->x - 2 > 0 ? roi->x - 2 : 0;
    int x1 = roi->x + roi->w + 2 < sw ? roi->x + roi->w + 2 : sw;
    JDIMENSION xoff = (JDIMENSION)x0, cw = (JDIMENSION)(x1 - x0);
    if (x0 > 0 || x1 < sw) jpeg_crop_scanline(cinfo, &xoff, &cw);
    int aw = (int)cinfo->output_width, dx = roi->x - (int)xoff;
    if (dx < 0 || dx + roi->w > aw)
        return CH_ERROR(CH_ERR_INTERNAL, "%s: JPEG crop %u+%u does not cover columns %d..%d", name,
                        xoff, cw, roi->x, roi->x + roi->w);
    int c = (native == 3 || channels == 3) ? 3 : 1;
    /* rows of aw pixels, plus one spare row for the last scanline */
    ch_status st = ch_image_reshape(img, roi->h + 1, aw, c);
    if (st) return ch_error_context("%s", name);
    size_t stride = (size_t)aw * (size_t)c;
    if (roi->y > 0) jpeg_skip_scanlines(cinfo, (JDIMENSION)roi->y);
    for (int r = 0; r < roi->h && !err->eof; r++) {
        JSAMPROW row = img->data + (size_t)r * stride;
        if (jpeg_read_scanlines(cinfo, &row, 1) != 1) break;
        if (native == 1 && channels == 3) gray_to_rgb_row(row, aw);
    }
    /* The rows below the region: a single-scan file that ends with its EOI
     * marker (FF D9) is complete (libjpeg would find that marker, not the
     * end of the data), so decoding stops here. Any other file is decoded
     * through its last row (the entropy-coded data of the rows between is
     * read, not inverse-transformed), so that a truncated file fails with
     * the error of a full decode. (Multi-scan files were read whole by
     * jpeg_start_decompress.) */
    int complete = len >= 2 && buf[len - 2] == 0xff && buf[len - 1] == 0xd9;
    if (!complete && !err->eof && cinfo->output_scanline < cinfo->output_height) {
        JDIMENSION left = cinfo->output_height - cinfo->output_scanline;
        if (left > 1) jpeg_skip_scanlines(cinfo, left - 1);
        JSAMPROW row = img->data + (size_t)roi->h * stride;
        if (!err->eof) (void)jpeg_read_scanlines(cinfo, &row, 1);
    }
    if (!err->eof && cinfo->output_scanline == cinfo->output_height) jpeg_finish_decompress(cinfo);
    if (err->eof)
        return CH_ERROR(CH_ERR_FORMAT, "%s: JPEG file is truncated (premature end of data)",
                        name);
    size_t out_row = (size_t)roi->w * (size_t)c;
    for (int r = 0; r < roi->h; r++)
        memmove(img->data + (size_t)r * out_row, img->data + (size_t)r * stride + (size_t)dx * (size_t)c,
                out_row);
    img->h = roi->h;
    img->w = roi->w;
    if (native == 3 && channels == 1) {
        rgb_to_l(img->data, img->data, (size_t)roi->h * (size_t)roi->w);
        img->c = 1;
    }
    img->full_h = h;
    img->full_w = w;
    img->scale_num = n;
    img->off_y = roi->y;
    img->off_x = roi->x;
    return CH_OK;
}

static ch_status decode_jpeg(const uint8_t *buf, size_t len, int channels, ch_image_t *img,
                             const char *name)
{
    struct jpeg_decompress_struct cinfo;
    struct jpeg_err err;
    memset(&err, 0, sizeof err);
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = jpeg_err_exit;
    err.pub.emit_message = jpeg_err_emit;
    if (setjmp(err.jb)) {
        jpeg_destroy_decompress(&cinfo);
        return CH_ERROR(CH_ERR_FORMAT, "%s: cannot decode JPEG: %s", name, err.msg);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, buf, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    int native;
    switch (cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE: native = 1; cinfo.out_color_space = JCS_GRAYSCALE; break;
    case JCS_YCbCr:
    case JCS_RGB: native = 3; cinfo.out_color_space = JCS_RGB; break;
    default:
        jpeg_destroy_decompress(&cinfo);
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: JPEG colour space %d (CMYK/YCCK) not supported",
                        name, (int)cinfo.jpeg_color_space);
    }
    if (cinfo.image_width == 0 || cinfo.image_height == 0 ||
        cinfo.image_width > CH_IMAGE_MAX_SIDE || cinfo.image_height > CH_IMAGE_MAX_SIDE ||
        (long)cinfo.image_width * (long)cinfo.image_height > CH_IMAGE_MAX_PIXELS) {
        jpeg_destroy_decompress(&cinfo);
        return CH_ERROR(CH_ERR_FORMAT, "%s: JPEG size %ux%u out of range (at most %ld pixels)",
                        name, cinfo.image_width, cinfo.image_height, (long)CH_IMAGE_MAX_PIXELS);
    }
    int h = (int)cinfo.image_height, w = (int)cinfo.image_width;
    ch_image_roi_t roi;
    if (img->roi_fn && img->roi_fn(img->roi_ctx, h, w, &roi)) {
        ch_status rst = decode_jpeg_roi(&cinfo, &err, buf, len, &roi, native, channels, img, name);
        jpeg_destroy_decompress(&cinfo);
        return rst;
    }
    /* room for 3 channels: conversions run in place */
    ch_status st = ch_image_reshape(img, h, w, (native == 3 || channels == 3) ? 3 : 1);
    if (st) {
        jpeg_destroy_decompress(&cinfo);
        return ch_error_context("%s", name);
    }
    jpeg_start_decompress(&cinfo);
    if ((int)cinfo.output_components != native || (int)cinfo.output_width != w ||
        (int)cinfo.output_height != h) {
        jpeg_destroy_decompress(&cinfo);
        return CH_ERROR(CH_ERR_FORMAT, "%s: unexpected JPEG output %ux%ux%d", name,
                        cinfo.output_width, cinfo.output_height, cinfo.output_components);
    }
    size_t stride = (size_t)w * (size_t)img->c;
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = img->data + (size_t)cinfo.output_scanline * stride;
        if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) break;
        if (native == 1 && channels == 3) gray_to_rgb_row(row, w);
        if (err.eof) break;
    }
    if (!err.eof) jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (err.eof)
        return CH_ERROR(CH_ERR_FORMAT, "%s: JPEG file is truncated (premature end of data)",
                        name);
    if (native == 3 && channels == 1) {
        rgb_to_l(img->data, img->data, (size_t)h * (size_t)w);
        img->c = 1;
    }
    return CH_OK;
}

/* ------------------------------------------------------------------ PNG */

struct png_ctx {
    const uint8_t *buf;
    size_t len, pos;
    char msg[256];
};

static void png_read_cb(png_structp p, png_bytep out, png_size_t n)
{
    struct png_ctx *c = png_get_io_ptr(p);
    if (n > c->len - c->pos) png_error(p, "file is truncated");
    memcpy(out, c->buf + c->pos, n);
    c->pos += n;
}

static void png_err_cb(png_structp p, png_const_charp msg)
{
    struct png_ctx *c = png_get_error_ptr(p);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(p, 1);
}

static void png_warn_cb(png_structp p, png_const_charp msg) { (void)p; (void)msg; }

static ch_status decode_png(const uint8_t *buf, size_t len, int channels, ch_image_t *img,
                            const char *name)
{
    struct png_ctx ctx = {buf, len, 0, "unknown error"};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, png_err_cb, png_warn_cb);
    if (!png) return CH_ERROR(CH_ERR_NOMEM, "%s: png_create_read_struct failed", name);
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return CH_ERROR(CH_ERR_NOMEM, "%s: png_create_info_struct failed", name);
    }
    /* status set before a longjmp target can see it must be volatile */
    volatile ch_status st = CH_OK;
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        if (st != CH_OK) return st;
        return CH_ERROR(CH_ERR_FORMAT, "%s: cannot decode PNG: %s", name, ctx.msg);
    }
    png_set_read_fn(png, &ctx, png_read_cb);
    png_set_user_limits(png, CH_IMAGE_MAX_SIDE, CH_IMAGE_MAX_SIDE);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    int bit_depth = png_get_bit_depth(png, info), color_type = png_get_color_type(png, info);
    if ((long)w * (long)h > CH_IMAGE_MAX_PIXELS) {
        png_destroy_read_struct(&png, &info, NULL);
        return CH_ERROR(CH_ERR_FORMAT, "%s: PNG size %ux%u out of range (at most %ld pixels)",
                        name, (unsigned)w, (unsigned)h, (long)CH_IMAGE_MAX_PIXELS);
    }
    if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (bit_depth == 16) png_set_strip_16(png);
    png_set_strip_alpha(png);
    int gray = !(color_type & PNG_COLOR_MASK_COLOR) && color_type != PNG_COLOR_TYPE_PALETTE;
    if (gray && channels == 3) png_set_gray_to_rgb(png);
    int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int out_c = png_get_channels(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    if ((out_c != 1 && out_c != 3) || png_get_bit_depth(png, info) != 8 ||
        rowbytes != (size_t)w * (size_t)out_c) {
        png_destroy_read_struct(&png, &info, NULL);
        return CH_ERROR(CH_ERR_FORMAT, "%s: unexpected PNG layout (%d channels, %zu bytes/row)",
                        name, out_c, rowbytes);
    }
    ch_status rs = ch_image_reshape(img, (int)h, (int)w, out_c);
    if (rs) {
        png_destroy_read_struct(&png, &info, NULL);
        return ch_error_context("%s", name);
    }
    for (int pass = 0; pass < passes; pass++)
        for (png_uint_32 y = 0; y < h; y++) png_read_row(png, img->data + (size_t)y * rowbytes, NULL);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    if (out_c == 3 && channels == 1) {
        rgb_to_l(img->data, img->data, (size_t)h * (size_t)w);
        img->c = 1;
    }
    return CH_OK;
}

ch_status ch_image_decode(const uint8_t *buf, size_t len, int channels, ch_image_t *img,
                          const char *name)
{
    if (!name) name = "<memory>";
    CH_REQUIRE(channels == 1 || channels == 3, "%s: channels %d (expected 1 or 3)", name, channels);
    if (len == 0) return CH_ERROR(CH_ERR_FORMAT, "%s: empty file (0 bytes), not an image", name);
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (len >= 3 && buf[0] == 0xff && buf[1] == 0xd8 && buf[2] == 0xff)
        return decode_jpeg(buf, len, channels, img, name);
    if (len >= 8 && memcmp(buf, png_sig, 8) == 0) return decode_png(buf, len, channels, img, name);
    if ((len >= 2 && buf[0] == 'B' && buf[1] == 'M') || (len >= 4 && memcmp(buf, "GIF8", 4) == 0) ||
        (len >= 4 && (memcmp(buf, "II*\0", 4) == 0 || memcmp(buf, "MM\0*", 4) == 0)) ||
        (len >= 12 && memcmp(buf, "RIFF", 4) == 0 && memcmp(buf + 8, "WEBP", 4) == 0) ||
        (len >= 2 && buf[0] == 'P' && buf[1] >= '1' && buf[1] <= '6'))
        return CH_ERROR(CH_ERR_UNSUPPORTED,
                        "%s: image format not supported (cohort decodes JPEG and PNG only)", name);
    return CH_ERROR(CH_ERR_FORMAT, "%s: not a JPEG or PNG file (first bytes %02x %02x %02x %02x)",
                    name, buf[0], len > 1 ? buf[1] : 0, len > 2 ? buf[2] : 0, len > 3 ? buf[3] : 0);
}

/* ------------------------------------------------------------ PNG writing */

struct png_out {
    uint8_t *buf;
    size_t len, cap;
    int nomem;
    char msg[256];
};

static void png_write_cb(png_structp p, png_bytep data, png_size_t n)
{
    struct png_out *o = png_get_io_ptr(p);
    if (o->len + n > o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 4096;
        while (nc < o->len + n) nc *= 2;
        uint8_t *q = realloc(o->buf, nc);
        if (!q) {
            o->nomem = 1;
            png_error(p, "out of memory");
        }
        o->buf = q;
        o->cap = nc;
    }
    memcpy(o->buf + o->len, data, n);
    o->len += n;
}

static void png_flush_cb(png_structp p) { (void)p; }

static void png_werr_cb(png_structp p, png_const_charp msg)
{
    struct png_out *o = png_get_error_ptr(p);
    snprintf(o->msg, sizeof o->msg, "%s", msg);
    png_longjmp(p, 1);
}

ch_status ch_image_encode_png(const ch_image_t *img, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    CH_REQUIRE(img && img->data && img->h > 0 && img->w > 0 && (img->c == 1 || img->c == 3),
               "PNG encode: an image of 1 or 3 channels expected");
    struct png_out o = {NULL, 0, 0, 0, "unknown error"};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &o, png_werr_cb, png_warn_cb);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_write_struct(&png, NULL);
        return CH_ERROR(CH_ERR_NOMEM, "PNG encode: libpng structures");
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(o.buf);
        if (o.nomem) return CH_ERROR(CH_ERR_NOMEM, "PNG encode: out of memory");
        return CH_ERROR(CH_ERR_FORMAT, "PNG encode: %s", o.msg);
    }
    png_set_write_fn(png, &o, png_write_cb, png_flush_cb);
    png_set_compression_level(png, 6);
    png_set_IHDR(png, info, (png_uint_32)img->w, (png_uint_32)img->h, 8,
                 img->c == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < img->h; y++)
        png_write_row(png, (png_const_bytep)(img->data + (size_t)y * (size_t)img->w * (size_t)img->c));
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    *out = o.buf;
    *len = o.len;
    return CH_OK;
}
