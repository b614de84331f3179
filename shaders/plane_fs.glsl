#version 450 core
// Samples one virtual texture; writes display values (sRGB-encoded when the texture is sRGB).
#include "common.glsl"
#include "vt.glsl"

VT_DECLARE(u_vt)
uniform bool u_encode_srgb;
uniform int u_debug;     // 0: colour, 1: colour by resident level
in vec2 v_uv;
out vec4 f_color;

vec3 level_colour(float level) {
    const vec3 ramp[6] = vec3[](vec3(1, 0.2, 0.2), vec3(1, 0.6, 0.1), vec3(0.9, 0.9, 0.1),
                                vec3(0.2, 0.8, 0.2), vec3(0.2, 0.5, 1.0), vec3(0.7, 0.3, 0.9));
    return ramp[int(level) % 6];
}

void main() {
    vec4 c = VT_SAMPLE(u_vt, v_uv);
    if (u_debug == 1) {
        vec2 t = vt_texel(u_vt, v_uv);
        uvec4 e = vt_lookup(u_vt, t, 0);
        c = vec4(mix(c.rgb, level_colour(float(e.y)), 0.6), 1.0);
    }
    f_color = u_encode_srgb ? vec4(ts_linear_to_srgb(clamp(c.rgb, 0.0, 1.0)), c.a) : c;
}
