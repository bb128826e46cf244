/* The Huffman decoder for JPEGs with restart markers (jpeg_huffman.c). */
#ifndef RT_JPEG_HUFFMAN_H
#define RT_JPEG_HUFFMAN_H

#include <stdio.h>

#include <jpeglib.h>

/* After jpeg_start_decompress, before any row is read: installs the decoder when the scan is baseline
 * Huffman with restart markers and wholly in memory. Returns 1 if installed, 0 if libjpeg's stays. */
int rt_huffman_install(j_decompress_ptr cinfo);

#endif
