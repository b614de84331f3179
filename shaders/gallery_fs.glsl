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

void main() {
    vec3 c = GROUND;
    if (!u_ground) {
        VTInfo vt = VTInfo(v_size, vec4(v_tile.xyz, u_pool.tile.w), v_meta, u_pool.cells, u_pool.bias);
        c = vt_sample(u_pool_cache, vt, v_uv).rgb;
        c = vt_debug_tint(vt, v_uv, u_debug, c);
    }
    float fog = 1.0 - exp(-distance(u_eye, v_world) / u_fog_distance);
    c = mix(c, u_sky, clamp(fog, 0.0, 1.0));
    f_color = vec4(ts_linear_to_srgb(clamp(c, 0.0, 1.0)), 1.0);
}
