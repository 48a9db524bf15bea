#include "io/json_util.h"

#include <math.h>
#include <stdio.h>

cJSON *json_exact_number(double v) {
    if (!isfinite(v)) return cJSON_CreateNumber(v);
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    return cJSON_CreateRaw(buf);
}
