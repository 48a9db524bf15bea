/* JSON output helpers. */
#ifndef MOH_JSON_UTIL_H
#define MOH_JSON_UTIL_H
#include <cjson/cJSON.h>

/* A number item printed with 17 significant digits, so that it parses back to the same double
 * (cJSON's own printer may drop the last bit). Non-finite values fall back to cJSON's. */
cJSON *json_exact_number(double v);
#endif
