// includes a missing file on line 2
#include "does_not_exist.glsl"
