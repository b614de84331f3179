// Feedback compaction (engine/runtime/feedback.py): the entries vt_sample() appended this frame become
// a short list of unique page ids with how often each was wanted, before the CPU reads them back.
//
// Two dispatches over the feedback buffer (one invocation per entry slot):
//   pass 0: count each entry into vt_cw[hits_at + id]; the first invocation to count an id appends it
//           to the id list; ids >= n_ids are counted as invalid (the CPU drops header ids itself);
//   pass 1: for each listed id, copy its count beside it and clear its counter, so the counters are
//           all zero again for the next frame.
// Work buffer (uints): [0] ids listed, [1] invalid entries, [2] entries appended (may exceed the
// capacity), [3] unused; then `list_capacity` ids, `list_capacity` counts, then `n_ids` counters.
// The list cannot overflow: it holds each id below n_ids at most once, and list_capacity is at least
// n_ids or the feedback buffer's capacity, whichever is fewer (it also holds at most one id per entry).

#version 430

layout(local_size_x = 256) in;

layout(std430, binding = 7) readonly buffer VTFeedback {
    uint vt_fb_count;
    uint vt_fb_capacity;
    uint vt_fb_stride;
    uint vt_fb_phase;
    uint vt_fb_entries[];
};

layout(std430, binding = 6) buffer VTCompactWork {
    uint vt_cw[];
};

uniform uint n_ids;          // tile ids in use (counters at hits_at .. hits_at + n_ids)
uniform uint list_capacity;  // entries of the id list and of the count list
uniform uint hits_at;        // first counter: 4 + 2 * list_capacity
uniform int pass_index;      // 0: count and list, 1: counts out, counters cleared

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (pass_index == 0) {
        uint n = min(vt_fb_count, vt_fb_capacity);
        if (i == 0u) vt_cw[2] = vt_fb_count;
        if (i >= n) return;
        uint id = vt_fb_entries[i];
        if (id >= n_ids) {
            atomicAdd(vt_cw[1], 1u);
            return;
        }
        if (atomicAdd(vt_cw[hits_at + id], 1u) == 0u) {
            uint j = atomicAdd(vt_cw[0], 1u);
            vt_cw[4u + j] = id;
        }
    } else {
        if (i >= vt_cw[0]) return;
        uint id = vt_cw[4u + i];
        vt_cw[4u + list_capacity + i] = vt_cw[hits_at + id];
        vt_cw[hits_at + id] = 0u;
    }
}
