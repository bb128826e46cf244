/* Decodes only the part of a JPEG a crop needs, at the smallest DCT scale that still gives the crop at
 * least the output's resolution: libjpeg-turbo's scaled IDCT (8/8, 4/8, 2/8 or 1/8), jpeg_crop_scanline
 * (the columns, to iMCU boundaries) and jpeg_skip_scanlines (the rows above); the rows below are never
 * decoded. A YCbCr JPEG can come back as its planes, chroma at the resolution stored (the upsampler and
 * the colour converter bypassed, see copy_row_group): the loader resizes each plane to the output and
 * converts only the output's pixels. Called from data/src/image/jpeg.rs. libjpeg reports errors by
 * longjmp, which must not cross Rust frames: every call into libjpeg happens here, inside the setjmp, and
 * an error comes back as a message. */

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jpegint.h>

#include "jpeg_huffman.h"
#include "jpeg_region.h"

struct error_manager {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
};

static void on_error(j_common_ptr cinfo) {
  struct error_manager *err = (struct error_manager *)cinfo->err;
  longjmp(err->jump, 1);
}

/* Warnings (a corrupt byte libjpeg steps over) are not errors; nothing is printed. */
static void on_message(j_common_ptr cinfo) { (void)cinfo; }

static void message(j_common_ptr cinfo, char *error, size_t error_len) {
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  snprintf(error, error_len, "%s", text);
}

/* The image's size, without decoding it. Returns 0, or -1 with a message. */
int rt_jpeg_size(const unsigned char *data, unsigned long len, unsigned *width, unsigned *height, char *error,
                 size_t error_len) {
  struct jpeg_decompress_struct cinfo;
  struct error_manager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.output_message = on_message;
  if (setjmp(err.jump)) {
    message((j_common_ptr)&cinfo, error, error_len);
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, len);
  jpeg_read_header(&cinfo, TRUE);
  *width = cinfo.image_width;
  *height = cinfo.image_height;
  jpeg_destroy_decompress(&cinfo);
  return 0;
}

void rt_jpeg_free(unsigned char *pixels) { free(pixels); }

/* Adobe's CMYK JPEGs store inverted ink: each colour is its channel scaled by K. */
static void cmyk_to_rgb(const unsigned char *cmyk, unsigned char *rgb, unsigned width) {
  for (unsigned x = 0; x < width; x++) {
    unsigned k = cmyk[4 * x + 3];
    for (unsigned c = 0; c < 3; c++) rgb[3 * x + c] = (unsigned char)((cmyk[4 * x + c] * k + 127) / 255);
  }
}

/* The planes a planar decode fills, row group by row group (reached through cinfo->client_data). */
struct planes {
  unsigned char *plane[3];
  unsigned width[3], rows[3];
  unsigned group_rows[3]; /* each component's rows in one row group */
  unsigned groups;        /* row groups copied so far */
};

/* Each component's expansion to the output's pixels (1: as many samples as pixels, 2: half as many) in
 * `h` and `v`; 0 where the planes cannot be laid out as rt_region says (3:1 sampling, say, or Cb and Cr
 * sampled differently): RGB then. */
static int expansions(j_decompress_ptr cinfo, unsigned h[3], unsigned v[3]) {
  for (int ci = 0; ci < cinfo->num_components; ci++) {
    jpeg_component_info *c = &cinfo->comp_info[ci];
    unsigned out_h = cinfo->max_h_samp_factor * cinfo->min_DCT_scaled_size;
    unsigned out_v = cinfo->max_v_samp_factor * cinfo->min_DCT_scaled_size;
    unsigned in_h = c->h_samp_factor * c->DCT_scaled_size, in_v = c->v_samp_factor * c->DCT_scaled_size;
    if (in_h == 0 || in_v == 0 || out_h % in_h || out_v % in_v) return 0;
    h[ci] = out_h / in_h;
    v[ci] = out_v / in_v;
    if (h[ci] > 2 || v[ci] > 2) return 0;
  }
  /* the planes' layout: Y at every pixel, Cb and Cr alike */
  if (h[0] != 1 || v[0] != 1) return 0;
  if (cinfo->num_components == 3 && (h[1] != h[2] || v[1] != v[2])) return 0;
  return 1;
}

/* Stands in for the post-processing step (upsampling and colour conversion, jdsample.c and jdcolor.c)
 * once the rows above the crop are skipped: copies one row group of each component's samples, as the
 * IDCT left them, into its plane, and reports the group's rows as emitted. Called by the main controller
 * (jdmainct.c) through cinfo->post->post_process_data; `output_buf` is never written. */
static void copy_row_group(j_decompress_ptr cinfo, JSAMPIMAGE input_buf, JDIMENSION *in_row_group_ctr,
                           JDIMENSION in_row_groups_avail, JSAMPARRAY output_buf, JDIMENSION *out_row_ctr,
                           JDIMENSION out_rows_avail) {
  struct planes *p = cinfo->client_data;
  (void)output_buf;
  if (*in_row_group_ctr >= in_row_groups_avail || *out_row_ctr >= out_rows_avail) return;
  for (int ci = 0; ci < cinfo->num_components; ci++) {
    JSAMPARRAY rows = input_buf[ci] + (size_t)*in_row_group_ctr * p->group_rows[ci];
    for (unsigned r = 0; r < p->group_rows[ci]; r++) {
      unsigned row = p->groups * p->group_rows[ci] + r;
      if (row < p->rows[ci]) memcpy(p->plane[ci] + (size_t)row * p->width[ci], rows[r], p->width[ci]);
    }
  }
  p->groups++;
  JDIMENSION emitted = (JDIMENSION)cinfo->max_v_samp_factor;
  JDIMENSION left = cinfo->output_height - cinfo->output_scanline - *out_row_ctr;
  if (emitted > left) emitted = left;
  if (emitted > out_rows_avail - *out_row_ctr) emitted = out_rows_avail - *out_row_ctr;
  *out_row_ctr += emitted;
  (*in_row_group_ctr)++;
}

/* Decodes the crop (x, y, w, h, in the image's pixels) as it will be resized to `out` x `out`: at the
 * smallest scale of 8/8, 4/8, 2/8, 1/8 at which the crop keeps at least `out` pixels on each side. With
 * `own_huffman`, a JPEG with restart markers is entropy-decoded by jpeg_huffman.c (libjpeg-turbo's slow
 * path otherwise). With `planar`, a grey JPEG, or a YCbCr one whose chroma is at half resolution (either
 * way or both) at the scale decoded, comes back as planes. Returns 0, or -1 with a message. */
int rt_jpeg_region(const unsigned char *data, unsigned long len, double x, double y, double w, double h,
                   unsigned out, int own_huffman, int planar, struct rt_region *region, char *error,
                   size_t error_len) {
  struct jpeg_decompress_struct cinfo;
  struct error_manager err;
  struct planes planes;
  unsigned char *volatile pixels = NULL;
  unsigned char *volatile row = NULL;
  memset(region, 0, sizeof *region);
  memset(&planes, 0, sizeof planes);
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.output_message = on_message;
  if (setjmp(err.jump)) {
    message((j_common_ptr)&cinfo, error, error_len);
    jpeg_destroy_decompress(&cinfo);
    free(pixels);
    free(row);
    return -1;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, len);
  jpeg_read_header(&cinfo, TRUE);
  int cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  /* Halving only: libjpeg-turbo has SIMD IDCTs at 8/8, 4/8, 2/8 and 1/8, plain C ones at 3/8 to 7/8, which
   * cost more than the pixels they save (measured 2026-12-07, 400x350 photographs, one core: 0.98 ms a
   * crop at 8/8, 4/8 against 1.10 ms at the smallest of M/8, the 7/8 and 6/8 IDCTs 10% of the time). */
  unsigned scale = 8;
  while (scale > 1 && w * (scale / 2) / 8.0 >= out && h * (scale / 2) / 8.0 >= out) scale /= 2;
  cinfo.scale_num = scale;
  cinfo.scale_denom = 8;
  cinfo.dct_method = JDCT_ISLOW;
  unsigned layout = RT_RGB, expand_h[3] = {1, 1, 1}, expand_v[3] = {1, 1, 1};
  if (planar && cinfo.jpeg_color_space == JCS_YCbCr && cinfo.num_components == 3) layout = RT_YCBCR;
  if (planar && cinfo.jpeg_color_space == JCS_GRAYSCALE && cinfo.num_components == 1) layout = RT_GREY;
  if (layout != RT_RGB) {
    /* the components' DCT scaling is chosen here (jdmaster.c), before anything is allocated */
    jpeg_calc_output_dimensions(&cinfo);
    int laid_out = expansions(&cinfo, expand_h, expand_v);
    /* Chroma at every pixel (4:4:4, or 4:2:0 at a reduced scale): nothing saved by resizing it on its own,
     * and libjpeg's SIMD colour conversion of the region beat ours of the output (4:4:4 crops, one core:
     * 973 against 930 images/s, 2026-12-07). */
    if (layout == RT_YCBCR && expand_h[1] == 1 && expand_v[1] == 1) laid_out = 0;
    if (laid_out) {
      /* no colour conversion, and plain (not context-row) upsampling for the rows skipped above the crop:
       * after them, copy_row_group takes the samples before either step */
      cinfo.out_color_space = layout == RT_YCBCR ? JCS_YCbCr : JCS_GRAYSCALE;
      cinfo.do_fancy_upsampling = FALSE;
    } else {
      layout = RT_RGB;
    }
  }
  jpeg_start_decompress(&cinfo);
  unsigned installed = own_huffman ? (unsigned)rt_huffman_install(&cinfo) : 0;
  /* the crop in the scaled image, widened to whole pixels and kept inside it */
  double s = scale / 8.0; /* exact: a scaled block is M/8 of its pixels (output_width rounds up) */
  unsigned top = (unsigned)(y * s);
  unsigned bottom = (unsigned)((y + h) * s + 0.999999);
  JDIMENSION left = (JDIMENSION)(x * s);
  unsigned right = (unsigned)((x + w) * s + 0.999999);
  /* planes start on a row group, so that each group's chroma rows are whole */
  if (layout != RT_RGB) top -= top % (unsigned)cinfo.max_v_samp_factor;
  if (bottom > cinfo.output_height) bottom = cinfo.output_height;
  if (right > cinfo.output_width) right = cinfo.output_width;
  if (top >= bottom || left >= right) {
    snprintf(error, error_len, "an empty crop");
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  JDIMENSION width = right - left;
  if (left > 0 || width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &left, &width);
  if (top > 0) jpeg_skip_scanlines(&cinfo, top);
  unsigned rows = bottom - top;
  if (layout != RT_RGB) {
    size_t total = 0;
    for (int ci = 0; ci < cinfo.num_components; ci++) {
      planes.width[ci] = (width + expand_h[ci] - 1) / expand_h[ci];
      planes.rows[ci] = (rows + expand_v[ci] - 1) / expand_v[ci];
      planes.group_rows[ci] = (unsigned)cinfo.max_v_samp_factor / expand_v[ci];
      total += (size_t)planes.width[ci] * planes.rows[ci];
    }
    pixels = malloc(total);
    if (!pixels) {
      snprintf(error, error_len, "out of memory for %u x %u pixels", (unsigned)width, rows);
      jpeg_destroy_decompress(&cinfo);
      return -1;
    }
    unsigned char *next = pixels;
    for (int ci = 0; ci < cinfo.num_components; ci++) {
      planes.plane[ci] = next;
      next += (size_t)planes.width[ci] * planes.rows[ci];
    }
    cinfo.client_data = &planes;
    cinfo.post->post_process_data = copy_row_group;
    /* never written: copy_row_group fills the planes */
    JSAMPROW unused[4] = {NULL, NULL, NULL, NULL};
    while (cinfo.output_scanline < bottom) {
      if (jpeg_read_scanlines(&cinfo, unused, (JDIMENSION)cinfo.max_v_samp_factor) == 0) {
        snprintf(error, error_len, "the image ends at row %u", (unsigned)cinfo.output_scanline);
        jpeg_destroy_decompress(&cinfo);
        free(pixels);
        return -1;
      }
    }
  } else {
    unsigned channels = cmyk ? 4 : 3;
    pixels = malloc((size_t)width * rows * 3);
    /* RGB rows are decoded in place; CMYK ones through a row of their own */
    if (cmyk) row = malloc((size_t)cinfo.output_width * channels);
    if (!pixels || (cmyk && !row)) {
      snprintf(error, error_len, "out of memory for %u x %u pixels", (unsigned)width, rows);
      jpeg_destroy_decompress(&cinfo);
      free(pixels);
      free(row);
      return -1;
    }
    for (unsigned r = 0; r < rows; r++) {
      unsigned char *dest = pixels + (size_t)r * width * 3;
      JSAMPROW target = cmyk ? row : dest;
      if (jpeg_read_scanlines(&cinfo, &target, 1) != 1) {
        snprintf(error, error_len, "the image ends at row %u", top + r);
        jpeg_destroy_decompress(&cinfo);
        free(pixels);
        free(row);
        return -1;
      }
      if (cmyk) cmyk_to_rgb(row, dest, width);
    }
  }
  /* the rows below the crop are never decoded */
  jpeg_abort_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  free(row);
  region->pixels = pixels;
  region->width = width;
  region->height = rows;
  region->left = left;
  region->top = top;
  region->scale = scale;
  region->own_huffman = installed;
  region->layout = layout;
  region->chroma_h = layout == RT_YCBCR ? expand_h[1] : 1;
  region->chroma_v = layout == RT_YCBCR ? expand_v[1] : 1;
  return 0;
}
