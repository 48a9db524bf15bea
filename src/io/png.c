/* PNG output through libpng's simplified API (png_image_write_to_memory), then one atomic write. */
#include "io/png.h"

#include <png.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"

int png_write(const char *path, const uint8_t *pix, int w, int h, int channels, moh_error *err) {
    if (w < 1 || h < 1 || w > 1 << 16 || h > 1 << 16 || (channels != 1 && channels != 3))
        return moh_fail(err, MOH_E_ARG, "%s: image %dx%d with %d channels, expected 1..65536 pixels a side and 1 or 3 "
                        "channels", path, w, h, channels);
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    im.width = (png_uint_32)w;
    im.height = (png_uint_32)h;
    im.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    png_alloc_size_t len = 0;
    if (!png_image_write_to_memory(&im, NULL, &len, 0, pix, 0, NULL))
        return moh_fail(err, MOH_E_IO, "%s: PNG encoding failed (%s)", path, im.message);
    void *buf = malloc(len);
    if (!buf) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    int rc = MOH_OK;
    if (!png_image_write_to_memory(&im, buf, &len, 0, pix, 0, NULL))
        rc = moh_fail(err, MOH_E_IO, "%s: PNG encoding failed (%s)", path, im.message);
    if (!rc) rc = fs_write_atomic(path, buf, len, err);
    free(buf);
    return rc;
}
