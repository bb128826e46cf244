/* A Huffman decoder for baseline JPEGs with restart markers, installed in place of libjpeg-turbo's own
 * (jpeg_region.c calls rt_huffman_install after jpeg_start_decompress).
 *
 * Why: `datasets pack` writes a restart marker every few MCUs so that a crop is entropy-decoded alone
 * (restart.rs), and libjpeg-turbo turns its fast Huffman path off for every MCU of a file with restart
 * intervals (jdhuff.c's decode_mcu, 2.1.5 and 3.x): its fast path reads ahead through a 64-bit buffer and,
 * when it meets a marker, gives the MCU up and decodes it again on the slow path. Here the end of each
 * interval (the byte where its marker starts) is found first, with memchr, so the bit buffer is refilled
 * with the interval's bytes and then zeros, and no MCU is ever decoded twice. Symbols come from 11-bit
 * lookup tables; an AC coefficient whose code and magnitude both fit in 11 bits comes from one lookup
 * (as stb_image does: 11 bits measured 4% faster on a crop than 9). The coefficients are libjpeg's to the
 * bit: the tests decode every crop both ways.
 *
 * Data that breaks the rules (a bad code, a marker out of sequence, an interval that ends early) never
 * reads outside the buffer: the rest of that interval is zeros, as libjpeg gives it. */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>
#include <jpegint.h>

#include "jpeg_huffman.h"

#define FAST_BITS 11

/* one Huffman table, decoding ready */
struct table {
  /* FAST_BITS-bit prefix -> (code length << 8) | symbol, 0 where the code is longer */
  uint16_t fast[1 << FAST_BITS];
  /* AC only: prefix -> (value << 16) | (run << 8) | (code + magnitude bits), 0 where they do not fit */
  int32_t fast_ac[1 << FAST_BITS];
  /* codes longer than FAST_BITS: the largest code of each length (left-aligned in 16 bits, +1), and the
   * symbol index of its first code */
  uint32_t max_code[18];
  int delta[17];
  uint8_t values[256];
};

struct decoder {
  struct jpeg_entropy_decoder pub; /* first: libjpeg calls through cinfo->entropy */
  const JOCTET *next;              /* the next byte for the bit buffer */
  const JOCTET *end;               /* where the current interval's marker starts (or the data ends) */
  const JOCTET *data_end;
  uint64_t bits; /* left-aligned */
  int count;     /* valid bits in `bits` */
  int last_dc[MAX_COMPS_IN_SCAN];
  unsigned restarts_to_go;
  int next_restart;
  struct table *dc_of[D_MAX_BLOCKS_IN_MCU];
  struct table *ac_of[D_MAX_BLOCKS_IN_MCU];
  int component_of[D_MAX_BLOCKS_IN_MCU];
  struct table dc[NUM_HUFF_TBLS];
  struct table ac[NUM_HUFF_TBLS];
};

/* zigzag to natural order, the extra entries for a corrupt run past the block's end */
static const uint8_t natural[64 + 16] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33, 40, 48,
    41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23,
    30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63, 63, 63,
    63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

static int extend(uint32_t value, int size) {
  return value < (1u << (size - 1)) ? (int)value - (1 << size) + 1 : (int)value;
}

static void build(struct table *t, const JHUFF_TBL *source, int is_ac) {
  memset(t, 0, sizeof *t);
  if (!source) return;
  /* canonical codes, as in Annex C; libjpeg has already refused a table whose codes do not fit */
  int code = 0, k = 0;
  for (int length = 1; length <= 16; length++) {
    int n = source->bits[length];
    t->delta[length] = k - code;
    if (code + n > (1 << length)) { /* over-subscribed: libjpeg refuses it first; never index past */
      memset(t, 0, sizeof *t);
      return;
    }
    for (int i = 0; i < n && k < 256; i++, k++, code++) {
      t->values[k] = source->huffval[k];
      if (length <= FAST_BITS) {
        int spread = 1 << (FAST_BITS - length);
        for (int j = 0; j < spread; j++) t->fast[(code << (FAST_BITS - length)) + j] = (uint16_t)(length << 8 | source->huffval[k]);
      }
    }
    t->max_code[length] = (uint32_t)code << (16 - length);
    code <<= 1;
  }
  t->max_code[17] = UINT32_MAX;
  if (!is_ac) return;
  for (int prefix = 0; prefix < (1 << FAST_BITS); prefix++) {
    uint16_t entry = t->fast[prefix];
    if (!entry) continue;
    int length = entry >> 8, symbol = entry & 255, run = symbol >> 4, size = symbol & 15;
    if (size == 0 || length + size > FAST_BITS) continue;
    uint32_t magnitude = ((uint32_t)prefix >> (FAST_BITS - length - size)) & ((1u << size) - 1);
    t->fast_ac[prefix] = (int32_t)((uint32_t)extend(magnitude, size) << 16) | run << 8 | (length + size);
  }
}

/* the interval's next byte; zeros past its end, as libjpeg does at a marker */
static void refill(struct decoder *d) {
  while (d->count <= 56) {
    uint64_t byte = 0;
    if (d->next < d->end) {
      byte = *d->next++;
      if (byte == 0xFF) d->next++; /* FF 00: a stuffed FF (the interval's end is the first FF not so) */
    }
    d->bits |= byte << (56 - d->count);
    d->count += 8;
  }
}

static uint32_t take(struct decoder *d, int n) {
  uint32_t value = (uint32_t)(d->bits >> (64 - n));
  d->bits <<= n;
  d->count -= n;
  return value;
}

/* one symbol; needs 16 bits in the buffer */
static int decode(struct decoder *d, const struct table *t) {
  uint16_t entry = t->fast[d->bits >> (64 - FAST_BITS)];
  if (entry) {
    take(d, entry >> 8);
    return entry & 255;
  }
  uint32_t top = (uint32_t)(d->bits >> 48);
  int length = FAST_BITS + 1;
  while (top >= t->max_code[length]) length++;
  if (length > 16) { /* not a code of this table: libjpeg's answer, a zero */
    take(d, 16);
    return 0;
  }
  int index = (int)(top >> (16 - length)) + t->delta[length];
  take(d, length);
  return index >= 0 && index < 256 ? t->values[index] : 0;
}

/* Where the interval starting at `from` ends: the first FF not followed by 00 (a marker, or fill bytes
 * before one), or the end of the data. */
static const JOCTET *interval_end(const JOCTET *from, const JOCTET *end) {
  while (from < end) {
    const JOCTET *ff = memchr(from, 0xFF, (size_t)(end - from));
    if (!ff || ff + 1 >= end) return end;
    if (ff[1] != 0x00) return ff;
    from = ff + 2;
  }
  return end;
}

static void start_interval(struct decoder *d, const JOCTET *at) {
  d->next = at;
  d->end = interval_end(at, d->data_end);
  d->bits = 0;
  d->count = 0;
  for (int i = 0; i < MAX_COMPS_IN_SCAN; i++) d->last_dc[i] = 0;
}

/* At a restart: past the marker that ends this interval if it is the one expected; otherwise the next
 * interval stays empty (zeros), as libjpeg leaves data it cannot resynchronise to. */
static void restart(j_decompress_ptr cinfo, struct decoder *d) {
  const JOCTET *at = d->end;
  while (at < d->data_end && *at == 0xFF) at++; /* fill bytes, then the marker's code */
  if (at < d->data_end && *at == 0xD0 + d->next_restart) {
    start_interval(d, at + 1);
  } else {
    start_interval(d, d->data_end);
    WARNMS2(cinfo, JWRN_MUST_RESYNC, at < d->data_end ? *at : 0, d->next_restart);
  }
  d->next_restart = (d->next_restart + 1) & 7;
  d->restarts_to_go = cinfo->restart_interval;
}

static boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
  struct decoder *d = (struct decoder *)cinfo->entropy;
  if (d->restarts_to_go == 0) restart(cinfo, d);
  for (int blkn = 0; blkn < cinfo->blocks_in_MCU; blkn++) {
    JCOEF *block = MCU_data ? MCU_data[blkn][0] : NULL;
    const struct table *dc = d->dc_of[blkn], *ac = d->ac_of[blkn];
    if (d->count < 32) refill(d);
    int size = decode(d, dc) & 15;
    int diff = 0;
    if (size) {
      if (d->count < 16) refill(d);
      diff = extend(take(d, size), size);
    }
    int component = d->component_of[blkn];
    /* unsigned: repeated extreme differences in a hostile file wrap, as libjpeg's do, without UB */
    d->last_dc[component] = (int)((unsigned)d->last_dc[component] + (unsigned)diff);
    if (block) block[0] = (JCOEF)d->last_dc[component];
    for (int k = 1; k < 64;) {
      if (d->count < 32) refill(d);
      int32_t fast = ac->fast_ac[d->bits >> (64 - FAST_BITS)];
      if (fast) {
        k += (fast >> 8) & 15;
        take(d, fast & 255);
        if (block) block[natural[k]] = (JCOEF)(fast >> 16);
        k++;
        continue;
      }
      int symbol = decode(d, ac);
      int run = symbol >> 4;
      size = symbol & 15;
      if (size) {
        k += run;
        if (d->count < 16) refill(d);
        int value = extend(take(d, size), size);
        if (block) block[natural[k]] = (JCOEF)value;
        k++;
      } else if (run == 15) {
        k += 16;
      } else {
        break; /* end of block */
      }
    }
  }
  d->restarts_to_go--;
  /* where libjpeg would be, were it to read on (it does not: the caller aborts after its rows); `next` is
   * one past the data when its last byte is an FF */
  const JOCTET *at = d->next < d->data_end ? d->next : d->data_end;
  cinfo->src->next_input_byte = at;
  cinfo->src->bytes_in_buffer = (size_t)(d->data_end - at);
  return TRUE;
}

int rt_huffman_install(j_decompress_ptr cinfo) {
  if (cinfo->restart_interval == 0 || cinfo->progressive_mode || cinfo->arith_code ||
      cinfo->data_precision != 8 || cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU)
    return 0;
  /* the whole scan is in memory (jpeg_mem_src), and nothing of it has been read yet */
  if (cinfo->src->bytes_in_buffer == 0 || cinfo->unread_marker != 0) return 0;
  struct decoder *d =
      (struct decoder *)(*cinfo->mem->alloc_small)((j_common_ptr)cinfo, JPOOL_IMAGE, sizeof(struct decoder));
  memset(d, 0, offsetof(struct decoder, dc)); /* the tables are each built whole when used */
  d->pub.start_pass = cinfo->entropy->start_pass;
  d->pub.decode_mcu = decode_mcu;
  d->pub.insufficient_data = FALSE;
  int built_dc = 0, built_ac = 0;
  for (int blkn = 0; blkn < cinfo->blocks_in_MCU; blkn++) {
    int component = cinfo->MCU_membership[blkn];
    const jpeg_component_info *info = cinfo->cur_comp_info[component];
    int dc = info->dc_tbl_no, ac = info->ac_tbl_no;
    if (dc < 0 || dc >= NUM_HUFF_TBLS || ac < 0 || ac >= NUM_HUFF_TBLS) return 0;
    if (!(built_dc & 1 << dc)) build(&d->dc[dc], cinfo->dc_huff_tbl_ptrs[dc], 0);
    if (!(built_ac & 1 << ac)) build(&d->ac[ac], cinfo->ac_huff_tbl_ptrs[ac], 1);
    built_dc |= 1 << dc;
    built_ac |= 1 << ac;
    d->dc_of[blkn] = &d->dc[dc];
    d->ac_of[blkn] = &d->ac[ac];
    d->component_of[blkn] = component;
  }
  d->data_end = cinfo->src->next_input_byte + cinfo->src->bytes_in_buffer;
  start_interval(d, cinfo->src->next_input_byte);
  d->restarts_to_go = cinfo->restart_interval;
  d->next_restart = 0;
  cinfo->entropy = &d->pub;
  return 1;
}
