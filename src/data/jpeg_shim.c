/* libjpeg(-turbo) decoding of a region of a JPEG held in memory, optionally scaled in
 * the DCT domain. All libjpeg calls, and the longjmp its error handler needs, stay in
 * this file: the Rust side sees return codes and messages only. */

#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

struct shim_error {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int truncated;
};

static void shim_error_exit(j_common_ptr c) {
    struct shim_error *e = (struct shim_error *)c->err;
    longjmp(e->jump, 1);
}

/* Warnings: a file that ends early decodes as grey rows, which is recorded so the
 * caller can refuse it; other warnings (extraneous bytes, say) are harmless. */
static void shim_emit_message(j_common_ptr c, int level) {
    struct shim_error *e = (struct shim_error *)c->err;
    if (level < 0) {
        if (c->err->msg_code == JWRN_JPEG_EOF) {
            e->truncated = 1;
        }
        c->err->num_warnings++;
    }
}

/* Routes libjpeg's errors to the caller's setjmp and its warnings to shim_emit_message. */
static struct jpeg_error_mgr *shim_errors(struct shim_error *err) {
    struct jpeg_error_mgr *pub = jpeg_std_error(&err->pub);
    pub->error_exit = shim_error_exit;
    pub->emit_message = shim_emit_message;
    err->truncated = 0;
    return pub;
}

static void shim_message(j_common_ptr c, char *msg, size_t len) {
    char buffer[JMSG_LENGTH_MAX];
    (*c->err->format_message)(c, buffer);
    snprintf(msg, len, "%s", buffer);
}

/* Opens `data` and reads its header; errors jump to the caller's setjmp. */
static void shim_read_header(struct jpeg_decompress_struct *cinfo, const unsigned char *data, unsigned long len) {
    jpeg_create_decompress(cinfo);
    jpeg_mem_src(cinfo, data, len);
    jpeg_read_header(cinfo, TRUE);
}

/* The header: width, height and components. 0 on success. */
int ddp_jpeg_header(const unsigned char *data, unsigned long len, int *width, int *height, int *components,
                    char *msg, size_t msg_len) {
    struct jpeg_decompress_struct cinfo;
    struct shim_error err;
    cinfo.err = shim_errors(&err);
    if (setjmp(err.jump)) {
        shim_message((j_common_ptr)&cinfo, msg, msg_len);
        jpeg_destroy_decompress(&cinfo);
        return 1;
    }
    shim_read_header(&cinfo, data, len);
    *width = (int)cinfo.image_width;
    *height = (int)cinfo.image_height;
    *components = cinfo.num_components;
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

/* Decodes columns [x, x + w) of rows [y, y + h) of the image scaled by 1/scale_denom
 * (1, 2, 4 or 8) into `out` (h rows of w RGB pixels, packed). The region must lie inside
 * the scaled image, whose size is ceil(width / scale_denom) × ceil(height / scale_denom).
 * Only the iMCU columns that hold the region are decoded (jpeg_crop_scanline), the rows
 * above it are skipped without colour conversion or upsampling (jpeg_skip_scanlines),
 * and decoding stops after its last row. Grayscale becomes RGB; CMYK and YCCK (Adobe's
 * inverted CMYK included) become RGB as R = (255 - C)(255 - K)/255.
 * Returns 0 on success, 2 for a truncated file, 1 for any other error (message in msg). */
int ddp_jpeg_decode_region(const unsigned char *data, unsigned long len, int scale_denom, int x, int y, int w,
                           int h, unsigned char *out, char *msg, size_t msg_len) {
    struct jpeg_decompress_struct cinfo;
    struct shim_error err;
    JSAMPARRAY row = NULL;
    cinfo.err = shim_errors(&err);
    if (setjmp(err.jump)) {
        shim_message((j_common_ptr)&cinfo, msg, msg_len);
        jpeg_destroy_decompress(&cinfo);
        return 1;
    }
    shim_read_header(&cinfo, data, len);
    int cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    /* Adobe's CMYK files store inverted values. */
    int inverted = cmyk && cinfo.saw_Adobe_marker;
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)scale_denom;
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    if (x < 0 || y < 0 || w <= 0 || h <= 0 || (JDIMENSION)(x + w) > cinfo.output_width ||
        (JDIMENSION)(y + h) > cinfo.output_height) {
        snprintf(msg, msg_len, "region %dx%d at (%d, %d) is outside the %ux%u image", w, h, x, y,
                 cinfo.output_width, cinfo.output_height);
        jpeg_destroy_decompress(&cinfo);
        return 1;
    }
    /* The crop widens to whole iMCU columns: xoffset moves left, width grows. A pixel
     * on the crop's edge would take its chroma from the edge instead of the neighbour
     * column (fancy upsampling), so one more pixel is asked for on each side. */
    JDIMENSION xoffset = x > 0 ? (JDIMENSION)x - 1 : 0;
    JDIMENSION width = (JDIMENSION)(x + w + 1) - xoffset;
    if (xoffset + width > cinfo.output_width) {
        width = cinfo.output_width - xoffset;
    }
    if (width < cinfo.output_width) {
        jpeg_crop_scanline(&cinfo, &xoffset, &width);
    }
    int skip = x - (int)xoffset;
    int comps = cinfo.output_components;
    row = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE, cinfo.output_width * comps, 1);
    if (y > 0) {
        jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
    }
    for (int r = 0; r < h; r++) {
        if (jpeg_read_scanlines(&cinfo, row, 1) != 1) {
            snprintf(msg, msg_len, "the file ends before row %d of %d", y + r, cinfo.output_height);
            jpeg_destroy_decompress(&cinfo);
            return 2;
        }
        const unsigned char *src = row[0] + (size_t)skip * comps;
        unsigned char *dst = out + (size_t)r * w * 3;
        if (comps == 3) {
            memcpy(dst, src, (size_t)w * 3);
        } else {
            for (int i = 0; i < w; i++) {
                unsigned c = src[4 * i], m = src[4 * i + 1], yy = src[4 * i + 2], k = src[4 * i + 3];
                if (inverted) {
                    dst[3 * i] = (unsigned char)((c * k + 127) / 255);
                    dst[3 * i + 1] = (unsigned char)((m * k + 127) / 255);
                    dst[3 * i + 2] = (unsigned char)((yy * k + 127) / 255);
                } else {
                    dst[3 * i] = (unsigned char)(((255 - c) * (255 - k) + 127) / 255);
                    dst[3 * i + 1] = (unsigned char)(((255 - m) * (255 - k) + 127) / 255);
                    dst[3 * i + 2] = (unsigned char)(((255 - yy) * (255 - k) + 127) / 255);
                }
            }
        }
    }
    int truncated = err.truncated;
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (truncated) {
        snprintf(msg, msg_len, "the file ends early (truncated)");
        return 2;
    }
    return 0;
}

/* Encodes packed pixels (components 1: gray, 3: RGB, 4: CMYK) at `quality`, baseline or
 * progressive, into a buffer libjpeg allocates (*out, *out_len; the caller frees it with
 * ddp_jpeg_free).
 * Returns 0 on success, 1 with a message otherwise. */
int ddp_jpeg_encode(const unsigned char *pixels, int width, int height, int components, int quality,
                    int progressive, unsigned char **out, unsigned long *out_len, char *msg, size_t msg_len) {
    struct jpeg_compress_struct cinfo;
    struct shim_error err;
    cinfo.err = shim_errors(&err);
    *out = NULL;
    *out_len = 0;
    if (setjmp(err.jump)) {
        shim_message((j_common_ptr)&cinfo, msg, msg_len);
        jpeg_destroy_compress(&cinfo);
        return 1;
    }
    jpeg_create_compress(&cinfo);
    jpeg_mem_dest(&cinfo, out, out_len);
    cinfo.image_width = (JDIMENSION)width;
    cinfo.image_height = (JDIMENSION)height;
    cinfo.input_components = components;
    cinfo.in_color_space = components == 1 ? JCS_GRAYSCALE : components == 4 ? JCS_CMYK : JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, quality, TRUE);
    if (progressive) {
        jpeg_simple_progression(&cinfo);
    }
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = (JSAMPROW)(pixels + (size_t)cinfo.next_scanline * width * components);
        jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    return 0;
}

void ddp_jpeg_free(unsigned char *buffer) {
    free(buffer);
}
