/* Rewrites a JPEG losslessly with a restart marker every few MCUs (libjpeg's transcoding: the same DCT
 * coefficients, entropy-coded again with optimal Huffman tables), so that a crop can later be decoded
 * from the restart intervals it covers alone (data/src/image/restart.rs): the entropy decoding, most of a
 * JPEG's decoding time, is then paid for the crop's area rather than for every row above its bottom.
 * Called by `datasets pack` (data/src/image/jpeg.rs); errors come back as messages, as in jpeg_region.c. */

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

struct restart_error_manager {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
};

static void restart_on_error(j_common_ptr cinfo) {
  struct restart_error_manager *err = (struct restart_error_manager *)cinfo->err;
  longjmp(err->jump, 1);
}

static void restart_on_message(j_common_ptr cinfo) { (void)cinfo; }

/* MCUs per restart interval: a divisor of the MCUs in a row (so intervals never straddle rows), spanning
 * 16 to 64 pixels, closest to 32: narrow enough that a crop's columns cost little more than the crop,
 * wide enough that the markers (2 bytes, the byte alignment before them, the DC predictions they reset)
 * add about 1-2% to a photograph. With no such divisor: one MCU when an MCU is 16 pixels wide (4:2:0),
 * else the whole row (rows are still skipped). */
static unsigned restart_interval(unsigned mcus_per_row, unsigned mcu_width) {
  unsigned best = 0;
  for (unsigned d = 1; d <= mcus_per_row; d++) {
    unsigned span = d * mcu_width;
    if (mcus_per_row % d != 0 || span < 16 || span > 64) continue;
    if (!best || abs((int)span - 32) < abs((int)(best * mcu_width) - 32)) best = d;
  }
  if (best) return best;
  return mcu_width >= 16 ? 1 : mcus_per_row;
}

/* Returns 0 with the rewritten JPEG in *out (*out_len bytes; the caller frees it with rt_jpeg_free), 1
 * when the JPEG is left as it is (progressive or arithmetic-coded: decoded whole anyway), or -1 with a
 * message. */
int rt_jpeg_with_restarts(const unsigned char *data, unsigned long len, unsigned char **out,
                          unsigned long *out_len, char *error, size_t error_len) {
  struct jpeg_decompress_struct source;
  struct jpeg_compress_struct target;
  /* one error manager for both: a longjmp from either lands here, and its message is in it */
  struct restart_error_manager err;
  unsigned char *volatile written = NULL;
  unsigned long written_len = 0;
  volatile int target_made = 0;
  *out = NULL;
  *out_len = 0;
  source.err = jpeg_std_error(&err.pub);
  target.err = &err.pub;
  err.pub.error_exit = restart_on_error;
  err.pub.output_message = restart_on_message;
  if (setjmp(err.jump)) {
    char text[JMSG_LENGTH_MAX];
    (*err.pub.format_message)((j_common_ptr)&source, text);
    snprintf(error, error_len, "%s", text);
    if (target_made) jpeg_destroy_compress(&target);
    jpeg_destroy_decompress(&source);
    free(written);
    return -1;
  }
  jpeg_create_decompress(&source);
  jpeg_mem_src(&source, data, len);
  jpeg_read_header(&source, TRUE);
  if (source.progressive_mode || source.arith_code) {
    jpeg_destroy_decompress(&source);
    return 1;
  }
  jvirt_barray_ptr *coefficients = jpeg_read_coefficients(&source);
  jpeg_create_compress(&target);
  target_made = 1;
  jpeg_mem_dest(&target, (unsigned char **)&written, &written_len);
  jpeg_copy_critical_parameters(&source, &target);
  unsigned mcu_width = source.num_components == 1 ? 8 : 8 * (unsigned)source.max_h_samp_factor;
  unsigned mcus_per_row = (source.image_width + mcu_width - 1) / mcu_width;
  target.restart_interval = restart_interval(mcus_per_row, mcu_width);
  target.optimize_coding = TRUE;
  jpeg_write_coefficients(&target, coefficients);
  jpeg_finish_compress(&target);
  jpeg_destroy_compress(&target);
  jpeg_finish_decompress(&source);
  jpeg_destroy_decompress(&source);
  *out = written;
  *out_len = written_len;
  return 0;
}
