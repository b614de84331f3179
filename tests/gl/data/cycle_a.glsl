// cycle: cycle_a -> cycle_b -> cycle_a
#include "cycle_b.glsl"
