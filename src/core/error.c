#include "moh.h"

#include <stdarg.h>
#include <stdio.h>

int moh_fail(moh_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        /* one line whatever a quoted input held (a file's string with a newline, say) */
        for (char *c = err->msg; *c; c++)
            if (*c == '\n' || *c == '\r') *c = ' ';
        err->code = code;
    }
    return code;
}
