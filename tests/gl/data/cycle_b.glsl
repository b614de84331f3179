// second half of the cycle

#include "cycle_a.glsl"
