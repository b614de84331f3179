// include chain: a -> b
#include "inc_b.glsl"
float inc_a(float x) { return inc_b(x) * 2.0; }
