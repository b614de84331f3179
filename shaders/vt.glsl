// texstream virtual texture sampling. Include from your fragment shader:
//
//     #include "texstream/vt.glsl"
//     VT_DECLARE(albedo)                       // declares the uniforms vt.bind(program, "albedo") sets
//     ...
//     vec4 c = VT_SAMPLE(albedo, uv);          // trilinear + anisotropic, never black
//
// Texture coordinates: by default v = 0 is the image's bottom row (the GL convention; a quad with
// v = 0 at the bottom of the screen shows the image right side up). A texture opened with
// origin=Origin.TOP_LEFT takes v = 0 as its top row (glTF, DirectX). The choice is one bit of
// meta.z, applied by vt_texel() where uv becomes a texel coordinate, so every lookup and the
// feedback name the same pages.
//
// Bindings (fixed, the same for every virtual texture, so any number of them draw in one frame):
//   storage buffer VT_PAGES_BINDING (6)     page tables of every open texture (one uint per page)
//   storage buffer VT_FEEDBACK_BINDING (7)  the pages fragments wanted this frame (streamer feedback)
//   texture units 8 and up                  one per cache pool (texel format x slot size), set by bind()
//
// How a sample works: the level-0 texel coordinate uv * size gives derivatives, hence the level of
// detail (anisotropic: chosen on the footprint's minor axis, at most meta.w samples along the major
// one). For the two levels around it, the page table names the cache slot (layer and cell of the
// pool's texture array) of the wanted tile, or of its nearest resident ancestor when it is missing. Inside the tile, the coordinate is offset by the border; bilinear taps
// spread along the footprint's major axis filter anisotropically, clamped inside the slot. The two
// levels are blended: trilinear.

#ifndef TEXSTREAM_VT_GLSL
#define TEXSTREAM_VT_GLSL

#ifndef VT_PAGES_BINDING
#define VT_PAGES_BINDING 6
#endif
#ifndef VT_FEEDBACK_BINDING
#define VT_FEEDBACK_BINDING 7
#endif

struct VTInfo {
    vec4 size;        // level-0 width, height, and their reciprocals
    vec4 tile;        // content T, border B, slot S = T + 2B, 1 / (cache layer size in texels)
    ivec4 meta;       // level count, page-table base (first entry of this texture), flags (VT_META_*), max anisotropy
    ivec4 cells;      // cache slots per layer row, slots per layer, layers
    vec4 bias;        // x: lod bias added when sampling
};

// VTInfo.meta.z bits (engine/runtime/origin.py): wrap past the edges (else clamp); v = 0 is the
// image's top row (else its bottom row); writes no feedback (a texture set's member other than its
// lead: the lead's feedback stands for the whole set, engine/runtime/texture_sets.py).
#define VT_META_WRAP 1
#define VT_META_TOP_LEFT 2
#define VT_META_NO_FEEDBACK 4

// Level-0 texel coordinate of uv, rows counted from the image's top as the pack stores them: v is
// flipped unless the texture's origin is top-left.
vec2 vt_texel(VTInfo vt, vec2 uv) {
    vec2 t = uv * vt.size.xy;
    return (vt.meta.z & VT_META_TOP_LEFT) != 0 ? t : vec2(t.x, vt.size.y - t.y);
}

// A derivative of uv * size turned into one of vt_texel(): the same flip of its v part.
vec2 vt_texel_delta(VTInfo vt, vec2 d) {
    return (vt.meta.z & VT_META_TOP_LEFT) != 0 ? d : vec2(d.x, -d.y);
}

// Page tables (engine/runtime/page_table.py): entries base .. base + 15 hold each level's first
// page index; page (level, x, y) is entry vt_pages[base + level] + y * pages_x + x: the slot of
// the page's own tile in the pool (bits 27..0; its level in bits 31..28), or 0xFFFFFFFF when the
// tile is not resident.
layout(std430, binding = VT_PAGES_BINDING) readonly buffer VTPages {
    uint vt_pages[];
};

layout(std430, binding = VT_FEEDBACK_BINDING) buffer VTFeedback {
    uint vt_fb_count;      // entries appended this frame (may exceed capacity: extra ones dropped)
    uint vt_fb_capacity;
    uint vt_fb_stride;     // one fragment in stride x stride records what it wanted
    uint vt_fb_phase;      // which fragment of the cell, rotates every frame
    uint vt_fb_entries[];  // page indices (the same index as the page-table entry)
};

// Tiles are 64, 128 or 256 texels (engine/pack/format.py TILE_SIZES): a level's page is its texel
// coordinate shifted right by log2(T) + level, with no division (a shader's integer division by a
// value it cannot see costs tens of instructions a fragment).
int vt_page_shift(VTInfo vt, int level) {
    return findMSB(uint(vt.tile.x)) + level;
}

// Pages of `level` a side: ceil(size / (T 2^level)) (= ceil(ceil(size / 2^level) / T)).
ivec2 vt_pages_in_level(VTInfo vt, int level) {
    int s = vt_page_shift(vt, level);
    return (ivec2(vt.size.xy) + ((1 << s) - 1)) >> s;
}

// Index of the page under texel coordinate t at `level` (the page-table entry and the feedback id).
// t is clamped into the texture before it becomes an integer: pages past an edge are the edge's.
uint vt_page_index(VTInfo vt, vec2 t, int level) {
    ivec2 n = vt_pages_in_level(vt, level);
    ivec2 page = min(ivec2(clamp(t, vec2(0.0), vt.size.xy)) >> vt_page_shift(vt, level), n - 1);
    return vt_pages[vt.meta.y + level] + uint(page.y * n.x + page.x);
}

// a / b for b > 0, exact: below 2^20 through a float reciprocal and one correction (the product's
// error is under one there), else the integer division.
uint vt_udiv(uint a, uint b) {
    if (a >= (1u << 20)) return a / b;
    uint q = uint(float(a) * (1.0 / float(b)));
    int r = int(a) - int(q * b);
    return r < 0 ? q - 1u : (r >= int(b) ? q + 1u : q);
}

// The page's tile, or its nearest resident ancestor, decoded: (cache layer, its level, cell x,
// cell y). Entries name only resident tiles (engine/runtime/page_table.py), so a missing page walks
// up the levels; the coarsest levels are pinned, so the walk always ends on a resident tile.
uvec4 vt_lookup(VTInfo vt, vec2 t, int level) {
    uint e = 0xFFFFFFFFu;
    int l = level;
    for (; l < vt.meta.x; ++l) {
        e = vt_pages[vt_page_index(vt, t, l)];
        if (e != 0xFFFFFFFFu) break;
    }
    uint slot = e & 0x0FFFFFFFu;
    uint layers = uint(vt.cells.z);            // slots are numbered cell-major: cell, then layer
    uint cell = vt_udiv(slot, layers);
    uint layer = slot - cell * layers;
    uint row = uint(vt.cells.x);
    uint cy = vt_udiv(cell, row);
    return uvec4(layer, uint(min(l, vt.meta.x - 1)), cell - cy * row, cy);
}

// A sample's footprint, measured once for both levels (its shape does not change with the level:
// the levels' texel axes differ by powers of two). dx, dy: the derivatives of the level-0 texel
// coordinate. The level of detail is GL's rule on the footprint's minor axis, the major axis covered
// by up to meta.w anisotropic taps (what the border allows).
struct VTFootprint {
    vec2 major;        // the footprint's major axis, in level-0 texels
    float major_len;
    int taps;          // bilinear taps along it where it spans more than one texel
    float lod;
};

VTFootprint vt_footprint(VTInfo vt, vec2 dx, vec2 dy) {
    float lx = dot(dx, dx), ly = dot(dy, dy);
    float major = sqrt(max(lx, ly)), minor = sqrt(min(lx, ly));
    float max_taps = float(max(vt.meta.w, 1));
    float aniso = min(major / max(minor, 1e-8), max_taps);
    VTFootprint fp;
    fp.major = lx >= ly ? dx : dy;
    fp.major_len = major;
    fp.taps = int(clamp(ceil(major / max(minor, 1e-6)), 1.0, max_taps));
    fp.lod = log2(max(major / aniso, 1e-8));
    return fp;
}

float vt_lod(VTInfo vt, vec2 dx, vec2 dy) {
    return vt_footprint(vt, dx, dy).lod;
}

// One level: anisotropic filtering done here, as up to meta.w bilinear taps spread along the
// footprint's major axis (identical on every driver; exact at 1:1, where it is one tap). Taps are
// clamped inside the slot, so the border (B texels) is the most a footprint can reach.
vec4 vt_sample_level(sampler2DArray cache, VTInfo vt, vec2 t, VTFootprint fp, int level) {
    uvec4 e = vt_lookup(vt, t, level);
    float L = float(e.y);                      // the level actually resident (>= level)
    float scale = exp2(-L);
    float T = vt.tile.x, B = vt.tile.y, S = vt.tile.z;
    vec2 tl = t * scale;                       // texel coordinate at the resident level
    vec2 local = tl - floor(tl / T) * T;       // [0, T) inside the tile
    vec2 origin = vec2(e.zw) * S;              // the slot's corner in the layer
    float inv = vt.tile.w;                     // 1 / layer size
    vec2 major = fp.major * scale;             // in texels of level L
    int n = fp.major_len * scale <= 1.0 ? 1 : fp.taps;  // magnified or 1:1: a single bilinear tap
    vec4 acc = vec4(0.0);
    for (int i = 0; i < n; ++i) {
        float o = (float(i) + 0.5) / float(n) - 0.5;
        vec2 p = clamp(local + B + o * major, vec2(0.5), vec2(S - 0.5));
        acc += textureLod(cache, vec3((origin + p) * inv, float(e.x)), 0.0);
    }
    return acc / float(n);
}

// This fragment's place in its stride x stride cell of the screen. The stride is the same for every
// fragment; a power of two (the default 8, and its dense half) takes a mask, not a division.
ivec2 vt_feedback_cell(int stride) {
    ivec2 frag = ivec2(gl_FragCoord.xy);
    return (stride & (stride - 1)) == 0 ? frag & (stride - 1) : frag % stride;
}

// uv: texture coordinates; uv_dx, uv_dy: screen derivatives of uv * size (before any origin flip).
vec4 vt_sample_grad(sampler2DArray cache, VTInfo vt, vec2 uv, vec2 uv_dx, vec2 uv_dy) {
    int levels = vt.meta.x;
    vec2 size = vt.size.xy;
    vec2 t = vt_texel(vt, uv);
    VTFootprint fp = vt_footprint(vt, vt_texel_delta(vt, uv_dx), vt_texel_delta(vt, uv_dy));
    t = (vt.meta.z & VT_META_WRAP) != 0 ? mod(t, size) : clamp(t, vec2(0.0), size - 1e-3);
    float lod = clamp(fp.lod + vt.bias.x, 0.0, float(levels - 1));
    int l0 = int(floor(lod));
    int l1 = min(l0 + 1, levels - 1);
    float f = lod - float(l0);

    // Feedback: one fragment per stride cell records the finest page it wants; the CPU applies the
    // budget's mip bias when it reduces the entries. Members of a texture set other than its lead skip
    // it (a uniform branch): the CPU maps the lead's pages onto them.
    int stride = int(max(vt_fb_stride, 1u));
    ivec2 cell = vt_feedback_cell(stride);
    if ((vt.meta.z & VT_META_NO_FEEDBACK) == 0 && cell.x + cell.y * stride == int(vt_fb_phase)) {
        uint i = atomicAdd(vt_fb_count, 1u);
        if (i < vt_fb_capacity) vt_fb_entries[i] = vt_page_index(vt, t, clamp(l0, 0, levels - 1));
    }

    vec4 a = vt_sample_level(cache, vt, t, fp, l0);
    if (f < 1.0 / 512.0 || l1 == l0) return a;
    vec4 b = vt_sample_level(cache, vt, t, fp, l1);
    return mix(a, b, f);
}

vec4 vt_sample(sampler2DArray cache, VTInfo vt, vec2 uv) {
    vec2 t = uv * vt.size.xy;   // derivatives of the unwrapped coordinate: no seam at wrap edges
    return vt_sample_grad(cache, vt, uv, dFdx(t), dFdy(t));
}

// Residency debug views for a fragment at `uv`: mode 1 tints by the level sampled (red: 0, orange,
// yellow, green, cyan, blue, violet, white: 7), mode 2 by whether the wanted level is resident (green),
// one level coarser stands in (yellow) or more (red); mode 0 returns `colour` unchanged.
vec3 vt_level_colour(int level) {
    const vec3 ramp[8] = vec3[](vec3(1.0, 0.15, 0.15), vec3(1.0, 0.55, 0.1), vec3(0.95, 0.9, 0.1),
        vec3(0.25, 0.85, 0.25), vec3(0.1, 0.75, 0.85), vec3(0.25, 0.4, 1.0), vec3(0.7, 0.3, 0.95),
        vec3(0.9, 0.9, 0.9));
    return ramp[clamp(level, 0, 7)];
}

vec3 vt_debug_tint(VTInfo vt, vec2 uv, int mode, vec3 colour) {
    if (mode == 0) return colour;
    vec2 t = vt_texel(vt, uv);
    float lod = clamp(vt_lod(vt, dFdx(t), dFdy(t)), 0.0, float(vt.meta.x - 1));
    int want = int(floor(lod));
    int got = int(vt_lookup(vt, t, want).y);
    vec3 tint = mode == 1 ? vt_level_colour(got)
                          : (got == want ? vec3(0.2, 0.9, 0.3) : got == want + 1 ? vec3(1.0, 0.85, 0.1)
                                                                                 : vec3(1.0, 0.2, 0.15));
    return mix(colour, tint * 0.8, 0.55);
}

#define VT_DECLARE(name) \
    uniform sampler2DArray name##_cache; \
    uniform VTInfo name;

#define VT_SAMPLE(name, uv) vt_sample(name##_cache, name, uv)

#endif
