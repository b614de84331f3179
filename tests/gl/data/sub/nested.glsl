// nested include climbing out of its folder
#include "../inc_b.glsl"
float nested(float x) { return inc_b(x); }
