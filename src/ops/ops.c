/* Core ops: the template ops_impl.h instantiated for float (engine) and double (gradient checks). */
#include "ops.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#define real float
#define F(x) x##_f32
#include "ops_impl.h"
#undef real
#undef F

#define real double
#define F(x) x##_f64
#include "ops_impl.h"
#undef real
#undef F
