/* Decodes only the part of a JPEG a crop needs, at the smallest DCT scale that still gives the crop at
 * least the output's resolution: libjpeg-turbo's scaled IDCT (8/8, 4/8, 2/8 or 1/8), jpeg_crop_scanline
 * (the columns, to iMCU boundaries) and jpeg_skip_scanlines (the rows above); the rows below are never
 * decoded. Called from data/src/image/jpeg.rs. libjpeg reports errors by longjmp, which must not cross Rust
 * frames: every call into libjpeg happens here, inside the setjmp, and an error comes back as a message. */

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "jpeg_huffman.h"

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

/* What rt_jpeg_region decoded: `width` x `height` RGB pixels (row by row, in `pixels`, which the caller
 * frees with rt_jpeg_free) that are the image scaled by scale/8, from column `left` and row `top` of the
 * scaled image; `own_huffman` says whether jpeg_huffman.c entropy-decoded it. */
struct rt_region {
  unsigned char *pixels;
  unsigned width, height, left, top, scale, own_huffman;
};

void rt_jpeg_free(unsigned char *pixels) { free(pixels); }

/* Adobe's CMYK JPEGs store inverted ink: each colour is its channel scaled by K. */
static void cmyk_to_rgb(const unsigned char *cmyk, unsigned char *rgb, unsigned width) {
  for (unsigned x = 0; x < width; x++) {
    unsigned k = cmyk[4 * x + 3];
    for (unsigned c = 0; c < 3; c++) rgb[3 * x + c] = (unsigned char)((cmyk[4 * x + c] * k + 127) / 255);
  }
}

/* Decodes the crop (x, y, w, h, in the image's pixels) as it will be resized to `out` x `out`: at the
 * smallest scale of 8/8, 4/8, 2/8, 1/8 at which the crop keeps at least `out` pixels on each side. With
 * `own_huffman`, a JPEG with restart markers is entropy-decoded by jpeg_huffman.c (libjpeg-turbo's slow
 * path otherwise). Returns 0, or -1 with a message. */
int rt_jpeg_region(const unsigned char *data, unsigned long len, double x, double y, double w, double h,
                   unsigned out, int own_huffman, struct rt_region *region, char *error, size_t error_len) {
  struct jpeg_decompress_struct cinfo;
  struct error_manager err;
  unsigned char *volatile pixels = NULL;
  unsigned char *volatile row = NULL;
  memset(region, 0, sizeof *region);
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
  jpeg_start_decompress(&cinfo);
  unsigned installed = own_huffman ? (unsigned)rt_huffman_install(&cinfo) : 0;
  /* the crop in the scaled image, widened to whole pixels and kept inside it */
  double s = scale / 8.0; /* exact: a scaled block is M/8 of its pixels (output_width rounds up) */
  unsigned top = (unsigned)(y * s);
  unsigned bottom = (unsigned)((y + h) * s + 0.999999);
  JDIMENSION left = (JDIMENSION)(x * s);
  unsigned right = (unsigned)((x + w) * s + 0.999999);
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
  return 0;
}
