// texstream virtual texture sampling. Include from your fragment shader:
//
//     #include "vt.glsl"
//     VT_DECLARE(albedo)                       // declares the uniforms vt.bind(program, "albedo") sets
//     ...
//     vec4 c = VT_SAMPLE(albedo, uv);          // trilinear + anisotropic, never black
//
// The streamer's feedback also needs the wanted pages: VT_SAMPLE records them (into the SSBO bound
// at binding VT_FEEDBACK_BINDING) for one fragment in every VT_FEEDBACK stride cell per frame.
//
// How a sample works: the level-0 texel coordinate uv * size gives derivatives, hence the level of
// detail (anisotropic: chosen on the footprint's minor axis, at most meta.w samples along the major
// one). For the two levels around it, the page table (an RGBA16UI mip chain) names the cache layer,
// cell and the level actually resident there (the nearest resident ancestor when the wanted tile is
// missing). Inside the tile, the coordinate is offset by the border; bilinear taps spread along the
// footprint's major axis (derivatives scaled to the slot's texel space) filter anisotropically,
// clamped inside the slot. The two levels are blended: trilinear.

#ifndef TEXSTREAM_VT_GLSL
#define TEXSTREAM_VT_GLSL

#ifndef VT_FEEDBACK_BINDING
#define VT_FEEDBACK_BINDING 7
#endif

struct VTInfo {
    vec4 size;        // level-0 width, height, and their reciprocals
    vec4 tile;        // content T, border B, slot S = T + 2B, 1 / (cache layer size in texels)
    ivec4 meta;       // level count, texture id (feedback), wrap (1) or clamp (0), max anisotropy
    vec4 bias;        // x: lod bias added when sampling
};

layout(std430, binding = VT_FEEDBACK_BINDING) buffer VTFeedback {
    uint vt_fb_count;      // entries appended this frame (may exceed capacity: extra ones dropped)
    uint vt_fb_capacity;
    uint vt_fb_stride;     // one fragment in stride x stride records what it wanted
    uint vt_fb_phase;      // which fragment of the cell, rotates every frame
    uint vt_fb_entries[];
};

// Feedback entry (engine/runtime/feedback_reduce.py holds the same contract):
// texture id bits 31..24 | level 23..20 | page y 19..10 | page x 9..0.
uint vt_pack_feedback(uint tex_id, uint level, uvec2 page) {
    return (tex_id << 24) | ((level & 0xFu) << 20) | ((page.y & 0x3FFu) << 10) | (page.x & 0x3FFu);
}

// Pages of `level` a side: ceil(ceil(size / 2^level) / T).
ivec2 vt_pages_in_level(VTInfo vt, int level) {
    vec2 texels = ceil(vt.size.xy / exp2(float(level)));
    return ivec2(ceil(texels / vt.tile.x));
}

// Page table: a mip chain, level k of the virtual texture in mip k. Entry = (cache layer, level
// resident there, cell x, cell y): the wanted tile itself or its nearest resident ancestor.
uvec4 vt_lookup(usampler2D pages, VTInfo vt, vec2 t, int level) {
    ivec2 page = ivec2(floor(t / (vt.tile.x * exp2(float(level)))));
    page = clamp(page, ivec2(0), vt_pages_in_level(vt, level) - 1);
    return texelFetch(pages, page, level);
}

// One level: anisotropic filtering done here, as up to meta.w bilinear taps spread along the
// footprint's major axis (identical on every driver; exact at 1:1, where it is one tap). Taps are
// clamped inside the slot, so the border (B texels) is the most a footprint can reach.
vec4 vt_sample_level(sampler2DArray cache, usampler2D pages, VTInfo vt, vec2 t, vec2 dx, vec2 dy, int level) {
    uvec4 e = vt_lookup(pages, vt, t, level);
    float L = float(e.y);                      // the level actually resident (>= level)
    float scale = exp2(-L);
    float T = vt.tile.x, B = vt.tile.y, S = vt.tile.z;
    vec2 tl = t * scale;                       // texel coordinate at the resident level
    vec2 local = tl - floor(tl / T) * T;       // [0, T) inside the tile
    vec2 origin = vec2(e.zw) * S;              // the slot's corner in the layer
    float inv = vt.tile.w;                     // 1 / layer size
    vec2 ax = dx * scale, ay = dy * scale;     // footprint axes in texels of level L
    vec2 major = dot(ax, ax) >= dot(ay, ay) ? ax : ay;
    float minor_len = sqrt(min(dot(ax, ax), dot(ay, ay)));
    int n = int(clamp(ceil(length(major) / max(minor_len, 1e-6)), 1.0, float(max(vt.meta.w, 1))));
    if (length(major) <= 1.0) n = 1;           // magnified or 1:1: a single bilinear tap
    vec4 acc = vec4(0.0);
    for (int i = 0; i < n; ++i) {
        float o = (float(i) + 0.5) / float(n) - 0.5;
        vec2 p = clamp(local + B + o * major, vec2(0.5), vec2(S - 0.5));
        acc += textureLod(cache, vec3((origin + p) * inv, float(e.x)), 0.0);
    }
    return acc / float(n);
}

// Level of detail: GL's rule on the footprint's minor axis, the major axis covered by up to
// meta.w anisotropic samples (what the border allows).
float vt_lod(VTInfo vt, vec2 dx, vec2 dy) {
    float lx = dot(dx, dx), ly = dot(dy, dy);
    float major = sqrt(max(lx, ly)), minor = sqrt(min(lx, ly));
    float aniso = min(major / max(minor, 1e-8), float(max(vt.meta.w, 1)));
    return log2(max(major / aniso, 1e-8));
}

vec4 vt_sample_grad(sampler2DArray cache, usampler2D pages, VTInfo vt, vec2 uv, vec2 t_dx, vec2 t_dy) {
    int levels = vt.meta.x;
    vec2 size = vt.size.xy;
    vec2 t = uv * size;
    t = (vt.meta.z == 1) ? mod(t, size) : clamp(t, vec2(0.0), size - 1e-3);
    float lod = clamp(vt_lod(vt, t_dx, t_dy) + vt.bias.x, 0.0, float(levels - 1));
    int l0 = int(floor(lod));
    int l1 = min(l0 + 1, levels - 1);
    float f = lod - float(l0);

    // Feedback: one fragment per stride cell records the finest level it wants; the CPU applies
    // the budget's mip bias when it reduces the entries.
    int stride = int(max(vt_fb_stride, 1u));
    ivec2 cell = ivec2(gl_FragCoord.xy) % stride;
    if (cell.x + cell.y * stride == int(vt_fb_phase)) {
        int want = clamp(int(floor(lod)), 0, levels - 1);
        ivec2 page = clamp(ivec2(floor(t / (vt.tile.x * exp2(float(want))))), ivec2(0),
                           vt_pages_in_level(vt, want) - 1);
        uint i = atomicAdd(vt_fb_count, 1u);
        if (i < vt_fb_capacity) vt_fb_entries[i] = vt_pack_feedback(uint(vt.meta.y), uint(want), uvec2(page));
    }

    vec4 a = vt_sample_level(cache, pages, vt, t, t_dx, t_dy, l0);
    if (f < 1.0 / 512.0 || l1 == l0) return a;
    vec4 b = vt_sample_level(cache, pages, vt, t, t_dx, t_dy, l1);
    return mix(a, b, f);
}

vec4 vt_sample(sampler2DArray cache, usampler2D pages, VTInfo vt, vec2 uv) {
    vec2 t = uv * vt.size.xy;   // derivatives of the unwrapped coordinate: no seam at wrap edges
    return vt_sample_grad(cache, pages, vt, uv, dFdx(t), dFdy(t));
}

#define VT_DECLARE(name) \
    uniform sampler2DArray name##_cache; \
    uniform usampler2D name##_pages; \
    uniform VTInfo name;

#define VT_SAMPLE(name, uv) vt_sample(name##_cache, name##_pages, name, uv)

#endif
