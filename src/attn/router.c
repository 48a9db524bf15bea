/* MoH routers (learned two-stage, query-norm, none) and the load-balance loss: float32 and
 * float64 instantiations of router_impl.h. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/attn.h"

const char *attn_router_name(moh_router r) {
    return r == MOH_ROUTER_LEARNED ? "learned" : r == MOH_ROUTER_QUERY_NORM ? "query_norm" : "none";
}

const char *attn_rope_type_name(moh_rope_type t) {
    return t == MOH_ROPE_DEFAULT ? "default" : t == MOH_ROPE_LINEAR ? "linear" : t == MOH_ROPE_LLAMA3 ? "llama3" : NULL;
}

#define real float
#define F(x) x##_f32
#include "router_impl.h"
#undef real
#undef F

#define real double
#define F(x) x##_f64
#include "router_impl.h"
#undef real
#undef F
