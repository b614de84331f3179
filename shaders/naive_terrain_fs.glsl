#version 450 core
// The naive baseline: one mipmapped sRGB texture, the terrain's lighting (flat normal) and fog.
#include "texstream/common.glsl"
uniform sampler2D u_tex;
uniform vec3 u_eye;
uniform vec3 u_sun;
uniform vec3 u_sky;
uniform float u_fog_distance;
in vec2 v_uv;
in vec3 v_world;
out vec4 f_color;

void main() {
    // A plain texture uploaded top row first: its t = 0 is the image's top row, the opposite of
    // the GL-origin v that terrain_vs.glsl hands on.
    vec3 albedo = texture(u_tex, vec2(v_uv.x, 1.0 - v_uv.y)).rgb;
    float light = 0.35 + 0.9 * max(dot(vec3(0.0, 0.0, -1.0), normalize(u_sun)), 0.0);
    float fog = 1.0 - exp(-distance(u_eye, v_world) / u_fog_distance);
    vec3 c = mix(albedo * light, u_sky, clamp(fog, 0.0, 1.0));
    f_color = vec4(ts_linear_to_srgb(clamp(c, 0.0, 1.0)), 1.0);
}
