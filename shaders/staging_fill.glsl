// The staging-texture upload path (engine/runtime/texture_staging.py): copies BC blocks from the
// persistent-mapped staging ring, bound as a storage buffer, into a 32-bit-integer staging array of
// one texel per block (block-compatible with the cache's BC arrays for glCopyImageSubData).
//
// One dispatch per span of consecutive ring slots: work group row y is the span's tile y, read at
// ring slot (first_slot + y) * slot_blocks (the ring's stride may exceed a tile's bytes: slots are
// aligned and shared by tiles of several formats) and stored into staging layer first_layer + y;
// invocation x is the tile's block x in row-major block order, as the compressed data is stored.
// BLOCK_UINTS (defined by the loader): 2 for 8-byte blocks (BC1, BC4: RG32UI), 4 for 16-byte blocks
// (BC3, BC5, BC6H, BC7: RGBA32UI); IMAGE_UNIT and RING_BINDING: the engine's image unit (the context's
// last) and storage binding (the page tables', bound to them again after the uploads).

#version 430

layout(local_size_x = 64) in;

#if BLOCK_UINTS == 4
layout(std430, binding = RING_BINDING) readonly buffer StagingRing { uvec4 ring_blocks[]; };
layout(rgba32ui, binding = IMAGE_UNIT) writeonly uniform uimage2DArray staging;
#define RING_BLOCK(i) ring_blocks[i]
#else
layout(std430, binding = RING_BINDING) readonly buffer StagingRing { uvec2 ring_blocks[]; };
layout(rg32ui, binding = IMAGE_UNIT) writeonly uniform uimage2DArray staging;
#define RING_BLOCK(i) uvec4(ring_blocks[i], 0u, 0u)
#endif

uniform uint first_slot;   // ring slot of the span's first tile
uniform uint slot_blocks;  // the ring's stride in blocks
uniform int first_layer;   // staging layer of the span's first tile
uniform int side;          // blocks along a tile's side

void main() {
    uint block = gl_GlobalInvocationID.x;
    uint tile = gl_WorkGroupID.y;
    if (block >= uint(side * side)) return;
    ivec3 at = ivec3(int(block) % side, int(block) / side, first_layer + int(tile));
    imageStore(staging, at, RING_BLOCK((first_slot + tile) * slot_blocks + block));
}
