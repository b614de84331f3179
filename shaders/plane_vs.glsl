#version 450 core
// A W x H plane (level-0 texel units) at z = 0, drawn with a camera matrix; uv = position / size.
uniform mat4 u_mvp;
uniform vec2 u_size;
in vec2 in_pos;          // unit square corner, 0..1
out vec2 v_uv;

void main() {
    // World y grows down the image (row order, as the scene's cameras look at it); texture v grows
    // up the image (the GL origin, the streamer's default): v = 1 - y.
    v_uv = vec2(in_pos.x, 1.0 - in_pos.y);
    gl_Position = u_mvp * vec4(in_pos * u_size, 0.0, 1.0);
}
