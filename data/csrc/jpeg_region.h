/* Decoding the part of a JPEG a crop needs (jpeg_region.c): what data/src/image/jpeg.rs and the sanitizer
 * fuzz (fuzz_region.c) call. */
#ifndef RT_JPEG_REGION_H
#define RT_JPEG_REGION_H

#include <stddef.h>

/* How rt_jpeg_region's pixels are laid out. */
enum rt_layout {
  RT_RGB = 0,   /* width x height RGB pixels, row by row */
  RT_YCBCR = 1, /* three planes, each row by row: Y (width x height), then Cb and Cr, each a sample for
                 * every chroma_h x chroma_v pixels (1 or 2; the last sample of a row or column may cover
                 * fewer), as the JPEG stores them: chroma not upsampled, nothing converted */
  RT_GREY = 2,  /* one plane, width x height */
};

/* What rt_jpeg_region decoded: pixels (which the caller frees with rt_jpeg_free) laid out as `layout`
 * says, that are the image scaled by scale/8, from column `left` and row `top` of the scaled image;
 * `own_huffman` says whether jpeg_huffman.c entropy-decoded it. */
struct rt_region {
  unsigned char *pixels;
  unsigned width, height, left, top, scale, own_huffman, layout, chroma_h, chroma_v;
};

int rt_jpeg_size(const unsigned char *data, unsigned long len, unsigned *width, unsigned *height, char *error,
                 size_t error_len);

/* Decodes the crop (x, y, w, h, in the image's pixels) as it will be resized to `out` x `out`. With
 * `own_huffman`, a JPEG with restart markers is entropy-decoded by jpeg_huffman.c; with `planar`, a grey
 * JPEG, or a YCbCr one whose chroma is subsampled at the scale decoded, comes back as its planes (RT_GREY,
 * RT_YCBCR), anything else as RGB. Returns 0, or -1 with a message. */
int rt_jpeg_region(const unsigned char *data, unsigned long len, double x, double y, double w, double h,
                   unsigned out, int own_huffman, int planar, struct rt_region *region, char *error,
                   size_t error_len);

void rt_jpeg_free(unsigned char *pixels);

#endif
