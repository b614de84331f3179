#version 450 core
// The gallery: one instance per object, a square canvas lying on the ground (z = 0) at `in_rect`
// (world x, y, width, height), carrying its own virtual texture's description (per instance, so
// every object of a cache pool draws in one instanced call).
uniform mat4 u_view_proj;
in vec2 in_pos;          // unit square corner, 0..1
in vec4 in_rect;
in vec4 in_size;         // VTInfo.size of the object's texture
in vec4 in_tile;         // VTInfo.tile (x, y, z; w comes from the pool)
in ivec4 in_meta;        // VTInfo.meta
out vec2 v_uv;
out vec3 v_world;
flat out vec4 v_size;
flat out vec4 v_tile;
flat out ivec4 v_meta;

void main() {
    // World y grows down the image (row order, as the scene's cameras look at it); texture v grows
    // up the image (the GL origin, the streamer's default): v = 1 - y.
    v_uv = vec2(in_pos.x, 1.0 - in_pos.y);
    v_world = vec3(in_rect.xy + in_pos * in_rect.zw, 0.0);
    v_size = in_size;
    v_tile = in_tile;
    v_meta = in_meta;
    gl_Position = u_view_proj * vec4(v_world, 1.0);
}
