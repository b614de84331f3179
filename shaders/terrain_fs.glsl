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

vec3 level_colour(int level) {
    const vec3 ramp[8] = vec3[](vec3(1.0, 0.15, 0.15), vec3(1.0, 0.55, 0.1), vec3(0.95, 0.9, 0.1),
        vec3(0.25, 0.85, 0.25), vec3(0.1, 0.75, 0.85), vec3(0.25, 0.4, 1.0), vec3(0.7, 0.3, 0.95),
        vec3(0.9, 0.9, 0.9));
    return ramp[clamp(level, 0, 7)];
}

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

    if (u_debug != 0) {
        vec2 t = v_uv * u_albedo.size.xy;
        float lod = clamp(vt_lod(u_albedo, dFdx(t), dFdy(t)), 0.0, float(u_albedo.meta.x - 1));
        int want = int(floor(lod));
        uvec4 e = vt_lookup(u_albedo, t, want);
        vec3 tint = u_debug == 1 ? level_colour(int(e.y))
                                 : (int(e.y) == want ? vec3(0.2, 0.9, 0.3)
                                    : int(e.y) == want + 1 ? vec3(1.0, 0.85, 0.1) : vec3(1.0, 0.2, 0.15));
        c = mix(c, tint * 0.8, 0.55);
    }
    float fog = 1.0 - exp(-distance(u_eye, v_world) / u_fog_distance);
    c = mix(c, u_sky, clamp(fog, 0.0, 1.0));
    f_color = vec4(ts_linear_to_srgb(clamp(c, 0.0, 1.0)), 1.0);
}
