#version 450 core
// Terrain shading: albedo (sRGB virtual texture) lit through an optional BC5 normal map (second
// virtual texture, same uv), modulated by an optional detail texture (third virtual texture, same
// uv), distance fog, and debug views of what the streamer is doing.
#include "common.glsl"
#include "vt.glsl"

VT_DECLARE(u_albedo)
VT_DECLARE(u_normals)
VT_DECLARE(u_detail)
uniform bool u_has_normals;
uniform bool u_has_detail;
uniform int u_debug;          // 0 shaded, 1 colour by resident mip level, 2 colour by residency gap
uniform vec3 u_eye;
uniform vec3 u_sun;           // direction towards the sun (world, z < 0 is up)
uniform vec3 u_sky;           // linear fog / sky colour
uniform float u_fog_distance; // texels at which fog reaches 63 %
in vec2 v_uv;
in vec3 v_world;
out vec4 f_color;

void main() {
    vec4 albedo = VT_SAMPLE(u_albedo, v_uv);
    if (u_has_detail) {
        albedo.rgb *= mix(vec3(1.0), 2.0 * VT_SAMPLE(u_detail, v_uv).rgb, 0.35);
    }
    vec3 n = vec3(0.0, 0.0, -1.0);
    if (u_has_normals) {
        vec2 xy = VT_SAMPLE(u_normals, v_uv).xy * 2.0 - 1.0;
        n = normalize(vec3(xy.x, xy.y, -sqrt(max(0.0, 1.0 - dot(xy, xy)))));
    }
    float light = 0.35 + 0.9 * max(dot(n, normalize(u_sun)), 0.0);
    vec3 c = albedo.rgb * light;

    c = vt_debug_tint(u_albedo, v_uv, u_debug, c);
    float fog = 1.0 - exp(-distance(u_eye, v_world) / u_fog_distance);
    c = mix(c, u_sky, clamp(fog, 0.0, 1.0));
    f_color = vec4(ts_linear_to_srgb(clamp(c, 0.0, 1.0)), 1.0);
}
