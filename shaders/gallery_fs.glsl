#version 450 core
// Gallery shading: each object samples its own virtual texture, described per instance; the cache
// layout comes from the pool (`u_pool`, bound through one of the pool's textures). The ground
// between the objects is plain (no texture). Distance fog and the terrain's debug views.
#include "common.glsl"
#include "vt.glsl"

VT_DECLARE(u_pool)
uniform bool u_ground;        // the ground plane under the objects: flat colour
uniform int u_debug;          // 0 shaded, 1 colour by resident mip level, 2 colour by residency gap
uniform vec3 u_eye;
uniform vec3 u_sky;           // linear fog / sky colour
uniform float u_fog_distance; // world units at which fog reaches 63 %
in vec2 v_uv;
in vec3 v_world;
flat in vec4 v_size;
flat in vec4 v_tile;
flat in ivec4 v_meta;
out vec4 f_color;

const vec3 GROUND = vec3(0.045, 0.05, 0.055);

vec3 level_colour(int level) {
    const vec3 ramp[8] = vec3[](vec3(1.0, 0.15, 0.15), vec3(1.0, 0.55, 0.1), vec3(0.95, 0.9, 0.1),
        vec3(0.25, 0.85, 0.25), vec3(0.1, 0.75, 0.85), vec3(0.25, 0.4, 1.0), vec3(0.7, 0.3, 0.95),
        vec3(0.9, 0.9, 0.9));
    return ramp[clamp(level, 0, 7)];
}

void main() {
    vec3 c = GROUND;
    if (!u_ground) {
        VTInfo vt = VTInfo(v_size, vec4(v_tile.xyz, u_pool.tile.w), v_meta, u_pool.cells, u_pool.bias);
        c = vt_sample(u_pool_cache, vt, v_uv).rgb;
        if (u_debug != 0) {
            vec2 t = v_uv * vt.size.xy;
            float lod = clamp(vt_lod(vt, dFdx(t), dFdy(t)), 0.0, float(vt.meta.x - 1));
            int want = int(floor(lod));
            uvec4 e = vt_lookup(vt, t, want);
            vec3 tint = u_debug == 1 ? level_colour(int(e.y))
                                     : (int(e.y) == want ? vec3(0.2, 0.9, 0.3)
                                        : int(e.y) == want + 1 ? vec3(1.0, 0.85, 0.1) : vec3(1.0, 0.2, 0.15));
            c = mix(c, tint * 0.8, 0.55);
        }
    }
    float fog = 1.0 - exp(-distance(u_eye, v_world) / u_fog_distance);
    c = mix(c, u_sky, clamp(fog, 0.0, 1.0));
    f_color = vec4(ts_linear_to_srgb(clamp(c, 0.0, 1.0)), 1.0);
}
