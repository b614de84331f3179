// texstream: small helpers shared by the engine's shaders and usable from yours.
//
//     #include "texstream/common.glsl"
//
// Needs GLSL 3.30 or newer (gl_VertexID). Everything is prefixed ts_ to stay out of your names.

#ifndef TEXSTREAM_COMMON_GLSL
#define TEXSTREAM_COMMON_GLSL

// sRGB transfer functions (IEC 61966-2-1), per channel, for values in [0, 1].
vec3 ts_srgb_to_linear(vec3 c) {
    return mix(c / 12.92, pow((c + 0.055) / 1.055, vec3(2.4)), step(vec3(0.04045), c));
}

vec3 ts_linear_to_srgb(vec3 c) {
    return mix(c * 12.92, 1.055 * pow(c, vec3(1.0 / 2.4)) - 0.055, step(vec3(0.0031308), c));
}

// A triangle covering the whole viewport, from gl_VertexID alone: draw 3 vertices, no buffers.
vec2 ts_fullscreen_uv(int vertex_id) {
    return vec2(float((vertex_id << 1) & 2), float(vertex_id & 2));
}

vec4 ts_fullscreen_position(int vertex_id) {
    return vec4(ts_fullscreen_uv(vertex_id) * 2.0 - 1.0, 0.0, 1.0);
}

#endif
