/* Hostile JPEGs against the decoding shims, under AddressSanitizer and UndefinedBehaviorSanitizer
 * (scripts/fuzz-jpeg.sh builds and runs it from scripts/test.sh). A rank decodes whatever bytes a tenant's
 * shards hold, through jpeg_region.c and jpeg_huffman.c; the Rust tests check that damaged files are
 * decoded or refused, and this checks that no byte outside the buffer is ever read or written on the way,
 * which only a sanitizer sees.
 *
 * Seeds are made here with libjpeg (4:2:0, 4:2:2, 4:4:4 and grey, at several sizes and restart
 * intervals), first checked whole: jpeg_huffman.c's pixels must be libjpeg's. Then each round damages a
 * copy (cut short, a marker dropped in, bytes changed, FF bytes sprinkled), copies it into a buffer of
 * exactly its size (so any overread is seen) and decodes a random crop.
 *
 *   fuzz_region ROUNDS_PER_SEED */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "jpeg_region.h"

static unsigned long state = 12345;
static unsigned next(void) {
  state = state * 6364136223846793005UL + 1442695040888963407UL;
  return (unsigned)(state >> 33);
}

/* A photograph-like picture (gradients and noise) as a baseline JPEG with restart markers. */
static unsigned char *seed(unsigned width, unsigned height, int h_samp, int v_samp, int grey, unsigned interval,
                           unsigned long *size) {
  int channels = grey ? 1 : 3;
  unsigned char *pixels = malloc((size_t)width * height * channels);
  for (unsigned y = 0; y < height; y++)
    for (unsigned x = 0; x < width; x++)
      for (int c = 0; c < channels; c++)
        pixels[((size_t)y * width + x) * channels + c] =
            (unsigned char)((x * (c + 1) + y * (3 - c)) / 3 + next() % 40);
  struct jpeg_compress_struct cinfo;
  struct jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char *out = NULL;
  jpeg_mem_dest(&cinfo, &out, size);
  cinfo.image_width = width;
  cinfo.image_height = height;
  cinfo.input_components = channels;
  cinfo.in_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 90, TRUE);
  if (!grey) {
    cinfo.comp_info[0].h_samp_factor = h_samp;
    cinfo.comp_info[0].v_samp_factor = v_samp;
  }
  cinfo.restart_interval = interval;
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < height) {
    JSAMPROW row = pixels + (size_t)cinfo.next_scanline * width * channels;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  free(pixels);
  return out;
}

/* The whole seed both ways: the same pixels, and the own decoder used. */
static int same_as_libjpeg(const unsigned char *jpeg, unsigned long size, unsigned width, unsigned height) {
  struct rt_region own, theirs;
  char error[200];
  if (rt_jpeg_region(jpeg, size, 0, 0, width, height, width > height ? width : height, 1, 0, &own, error,
                     sizeof error) != 0 ||
      rt_jpeg_region(jpeg, size, 0, 0, width, height, width > height ? width : height, 0, 0, &theirs, error,
                     sizeof error) != 0) {
    fprintf(stderr, "a seed does not decode: %s\n", error);
    return 0;
  }
  int same = own.own_huffman && !theirs.own_huffman && own.width == theirs.width &&
             own.height == theirs.height &&
             memcmp(own.pixels, theirs.pixels, (size_t)own.width * own.height * 3) == 0;
  rt_jpeg_free(own.pixels);
  rt_jpeg_free(theirs.pixels);
  return same;
}

int main(int argc, char **argv) {
  long rounds = argc > 1 ? atol(argv[1]) : 1000;
  const struct {
    unsigned width, height;
    int h, v, grey;
    unsigned interval;
  } seeds[] = {{400, 350, 2, 2, 0, 1}, {333, 401, 2, 1, 0, 3}, {250, 190, 1, 1, 0, 2},
               {61, 47, 1, 1, 1, 4},   {97, 33, 2, 2, 0, 7}};
  long decoded = 0, refused = 0;
  for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
    unsigned long n = 0;
    unsigned char *jpeg = seed(seeds[s].width, seeds[s].height, seeds[s].h, seeds[s].v, seeds[s].grey,
                               seeds[s].interval, &n);
    if (!same_as_libjpeg(jpeg, n, seeds[s].width, seeds[s].height)) {
      fprintf(stderr, "seed %zu: the own Huffman decoder's pixels are not libjpeg's\n", s);
      return 1;
    }
    unsigned long scan = 0;
    for (unsigned long i = 0; i + 1 < n; i++)
      if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xDA) {
        scan = i + 2;
        break;
      }
    for (long round = 0; round < rounds; round++) {
      unsigned char *copy = malloc(n);
      memcpy(copy, jpeg, n);
      unsigned long len = n;
      switch (round % 5) {
      case 0: len = scan + next() % (n - scan); break;
      case 1: {
        unsigned long at = scan + next() % (n - scan - 2);
        copy[at] = 0xFF;
        copy[at + 1] = (unsigned char)(0xD0 + next() % 10);
        break;
      }
      case 2:
        for (unsigned k = 0; k < 1 + next() % 8; k++) copy[scan + next() % (n - scan)] = (unsigned char)next();
        break;
      case 3:
        for (unsigned k = 0; k < 1 + next() % 4; k++) copy[next() % n] = (unsigned char)next();
        break;
      default:
        for (unsigned long i = scan; i < n; i++)
          if (next() % 64 == 0) copy[i] = 0xFF;
      }
      unsigned char *exact = malloc(len);
      memcpy(exact, copy, len);
      free(copy);
      unsigned width = 0, height = 0;
      char error[200];
      if (rt_jpeg_size(exact, len, &width, &height, error, sizeof error) != 0 || width == 0 || height == 0 ||
          (unsigned long)width * height > (1UL << 24)) {
        refused++;
        free(exact);
        continue;
      }
      double w = 1 + next() % width, h = 1 + next() % height;
      double x = next() % (unsigned)(width - w + 1), y = next() % (unsigned)(height - h + 1);
      struct rt_region region;
      /* every other round as planes, as the loader asks */
      if (rt_jpeg_region(exact, len, x, y, w, h, 1 + next() % 224, 1, (int)(round & 1), &region, error,
                         sizeof error) == 0) {
        decoded++;
        rt_jpeg_free(region.pixels);
      } else {
        refused++;
      }
      free(exact);
    }
    free(jpeg);
  }
  printf("%ld damaged JPEGs decoded, %ld refused, no access outside a buffer\n", decoded, refused);
  return 0;
}
