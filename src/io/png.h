/* PNG output (libpng) of grey or RGB images. */
#ifndef MOH_IO_PNG_H
#define MOH_IO_PNG_H
#include <stdint.h>

#include "moh.h"

/* Writes pix [h, w, channels] (8-bit, row-major; channels 1 grey or 3 RGB) to path atomically (a
 * temporary file renamed into place: nothing is left at path on failure). MOH_E_ARG (bad sizes) or
 * MOH_E_IO naming the path. */
int png_write(const char *path, const uint8_t *pix, int w, int h, int channels, moh_error *err);
#endif
