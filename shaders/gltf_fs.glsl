#version 450 core
// glTF metallic-roughness shading, lite: one directional light (GGX specular, Lambert diffuse) and a
// sky / ground ambient term, with the material's five textures streamed as virtual textures:
// base colour (sRGB), normal (BC5: x, y), metallic-roughness (G roughness, B metal), occlusion (R)
// and emissive (sRGB), each multiplied by its factor as the glTF specification says.
//
// Sampler wrap modes: a pack baked with wrap (both axes repeat) or clamp (anything else) does its
// own addressing; on a clamp pack a repeating or mirrored axis is folded into [0, 1] here, the
// derivatives taken from the unfolded uv so the level of detail has no seam at the fold.
#include "common.glsl"
#include "vt.glsl"

// GLTF_MAPS (defined by the loader, one program per set of textures a material has): which of the
// textures are sampled, as bits (texstream.scene.gltf ROLE_BIT). A variant samples only what its
// materials have: every virtual-texture sample is a few hundred instructions, and software
// rasterizers' compile time grows much faster than linearly with their number. GLTF_DEBUG: the
// residency debug views (u_debug) are compiled in.
#define GLTF_HAS_BASE_COLOR 1
#define GLTF_HAS_NORMAL 2
#define GLTF_HAS_METALLIC_ROUGHNESS 4
#define GLTF_HAS_OCCLUSION 8
#define GLTF_HAS_EMISSIVE 16
#ifndef GLTF_MAPS
#define GLTF_MAPS 31
#endif
#ifndef GLTF_DEBUG
#define GLTF_DEBUG 0
#endif
#ifndef GLTF_OCCLUSION_IN_MR   // 1: the occlusion map is the metallic-roughness image's R channel
#define GLTF_OCCLUSION_IN_MR 0
#endif

#define GLTF_TEXTURE(name) VT_DECLARE(name) uniform ivec2 name##_wrap;
#if (GLTF_MAPS & GLTF_HAS_BASE_COLOR) != 0
GLTF_TEXTURE(u_base_color)
#endif
#if (GLTF_MAPS & GLTF_HAS_NORMAL) != 0
GLTF_TEXTURE(u_normal)
#endif
#if (GLTF_MAPS & GLTF_HAS_METALLIC_ROUGHNESS) != 0
GLTF_TEXTURE(u_metallic_roughness)
#endif
#if (GLTF_MAPS & GLTF_HAS_OCCLUSION) != 0
GLTF_TEXTURE(u_occlusion)
#endif
#if (GLTF_MAPS & GLTF_HAS_EMISSIVE) != 0
GLTF_TEXTURE(u_emissive)
#endif
// *_wrap values (texstream.scene.gltf WRAP_CODE)
#define GLTF_WRAP_CLAMP 0
#define GLTF_WRAP_REPEAT 1
#define GLTF_WRAP_MIRROR 2

uniform vec4 u_base_color_factor;
uniform vec2 u_metal_rough;          // metallicFactor, roughnessFactor
uniform float u_normal_scale;
uniform float u_occlusion_strength;
uniform vec3 u_emissive_factor;
uniform float u_alpha_cutoff;        // MASK: discard below it; < 0: no mask
uniform bool u_has_tangents;
uniform vec3 u_eye;
uniform vec3 u_light_dir;            // towards the light, world
uniform vec3 u_light_colour;         // linear radiance
uniform vec3 u_ambient_sky;
uniform vec3 u_ambient_ground;
#if GLTF_DEBUG != 0
uniform int u_debug;                 // 1 mip level, 2 residency (vt_debug_tint)
#endif
in vec3 v_world;
in vec3 v_normal;
in vec2 v_uv;
in vec4 v_tangent;
out vec4 f_color;

const float PI = 3.14159265;

float gltf_address(float u, int mode, bool pack_wraps) {
    if (mode == GLTF_WRAP_MIRROR) {
        float f = mod(u, 2.0);
        return f > 1.0 ? 2.0 - f : f;
    }
    if (mode == GLTF_WRAP_REPEAT && !pack_wraps) return fract(u);
    return u;  // the pack wraps (both axes repeat) or clamps by itself
}

vec4 gltf_sample(sampler2DArray cache, VTInfo vt, ivec2 wrap, vec2 uv) {
    vec2 t = uv * vt.size.xy;
    bool pack_wraps = (vt.meta.z & VT_META_WRAP) != 0;
    vec2 folded = vec2(gltf_address(uv.x, wrap.x, pack_wraps), gltf_address(uv.y, wrap.y, pack_wraps));
    return vt_sample_grad(cache, vt, folded, dFdx(t), dFdy(t));
}

#define GLTF_SAMPLE(name, uv) gltf_sample(name##_cache, name, name##_wrap, uv)

void main() {
    // derivatives for the tangent frame, taken before any branch
    vec3 dp_dx = dFdx(v_world), dp_dy = dFdy(v_world);
    vec2 duv_dx = dFdx(v_uv), duv_dy = dFdy(v_uv);

    vec4 base = u_base_color_factor;
#if (GLTF_MAPS & GLTF_HAS_BASE_COLOR) != 0
    base *= GLTF_SAMPLE(u_base_color, v_uv);
#endif

    float metal = u_metal_rough.x, rough = u_metal_rough.y;
#if (GLTF_MAPS & GLTF_HAS_METALLIC_ROUGHNESS) != 0
    vec4 mr = GLTF_SAMPLE(u_metallic_roughness, v_uv);
    rough *= mr.g;
    metal *= mr.b;
#endif
    rough = clamp(rough, 0.04, 1.0);
    metal = clamp(metal, 0.0, 1.0);

    vec3 n = normalize(v_normal);
    if (!gl_FrontFacing) n = -n;  // double-sided materials: the back face's own normal
#if (GLTF_MAPS & GLTF_HAS_NORMAL) != 0
    {
        vec2 xy = (GLTF_SAMPLE(u_normal, v_uv).xy * 2.0 - 1.0) * u_normal_scale;
        vec3 tn = vec3(xy, sqrt(max(0.0, 1.0 - dot(xy, xy))));
        vec3 t, b;
        if (u_has_tangents) {
            t = normalize(v_tangent.xyz - n * dot(n, v_tangent.xyz));
            b = cross(n, t) * (v_tangent.w < 0.0 ? -1.0 : 1.0);
        } else {  // the frame from screen derivatives of position and uv
            float det = duv_dx.x * duv_dy.y - duv_dy.x * duv_dx.y;
            vec3 tu = (duv_dy.y * dp_dx - duv_dx.y * dp_dy) * (abs(det) > 1e-20 ? 1.0 / det : 0.0);
            tu -= n * dot(n, tu);
            t = dot(tu, tu) > 1e-20 ? normalize(tu) : normalize(cross(abs(n.y) < 0.99 ? vec3(0, 1, 0) : vec3(1, 0, 0), n));
            b = cross(n, t);
        }
        if (!gl_FrontFacing) { t = -t; b = -b; }
        n = normalize(mat3(t, b, n) * tn);
    }
#endif

    vec3 v = normalize(u_eye - v_world);
    vec3 l = normalize(u_light_dir);
    vec3 h = normalize(l + v);
    float nl = max(dot(n, l), 0.0), nv = max(dot(n, v), 1e-4), nh = max(dot(n, h), 0.0), vh = max(dot(v, h), 0.0);
    vec3 f0 = mix(vec3(0.04), base.rgb, metal);
    vec3 fresnel = f0 + (1.0 - f0) * pow(1.0 - vh, 5.0);
    float a2 = rough * rough * rough * rough;
    float d = a2 / (PI * pow(nh * nh * (a2 - 1.0) + 1.0, 2.0));
    float k = (rough + 1.0) * (rough + 1.0) / 8.0;
    float g = (nl / (nl * (1.0 - k) + k)) * (nv / (nv * (1.0 - k) + k));
    vec3 specular = d * g * fresnel / max(4.0 * nl * nv, 1e-4);
    vec3 diffuse = (1.0 - fresnel) * (1.0 - metal) * base.rgb / PI;
    vec3 c = (diffuse + specular) * u_light_colour * nl;

    float occlusion = 1.0;
#if (GLTF_MAPS & GLTF_HAS_OCCLUSION) != 0
    occlusion = mix(1.0, GLTF_SAMPLE(u_occlusion, v_uv).r, u_occlusion_strength);
#elif GLTF_OCCLUSION_IN_MR != 0 && (GLTF_MAPS & GLTF_HAS_METALLIC_ROUGHNESS) != 0
    occlusion = mix(1.0, mr.r, u_occlusion_strength);
#endif
    vec3 ambient = mix(u_ambient_ground, u_ambient_sky, n.y * 0.5 + 0.5);
    c += ambient * base.rgb * (1.0 - 0.5 * metal) * occlusion;
    vec3 emissive = u_emissive_factor;
#if (GLTF_MAPS & GLTF_HAS_EMISSIVE) != 0
    emissive *= GLTF_SAMPLE(u_emissive, v_uv).rgb;
#endif
    c += emissive;

#if GLTF_DEBUG != 0 && (GLTF_MAPS & GLTF_HAS_BASE_COLOR) != 0
    c = vt_debug_tint(u_base_color, v_uv, u_debug, c);
#endif
    if (u_alpha_cutoff >= 0.0 && base.a < u_alpha_cutoff) discard;  // MASK; last: every sample above
                                                                     // ran in uniform control flow
    c = c / (1.0 + max(max(c.r, c.g), c.b) * 0.15);  // a gentle shoulder instead of a hard clip
    f_color = vec4(ts_linear_to_srgb(clamp(c, 0.0, 1.0)), base.a);
}
