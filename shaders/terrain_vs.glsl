#version 450 core
// The ground: a W x H plane (level-0 texels of the albedo texture) at z = 0.
uniform mat4 u_view_proj;
uniform vec2 u_size;
in vec2 in_pos;          // unit square corner, 0..1
out vec2 v_uv;
out vec3 v_world;

void main() {
    // World y grows down the image (row order, as the scene's cameras look at it); texture v grows
    // up the image (the GL origin, the streamer's default): v = 1 - y.
    v_uv = vec2(in_pos.x, 1.0 - in_pos.y);
    v_world = vec3(in_pos * u_size, 0.0);
    gl_Position = u_view_proj * vec4(v_world, 1.0);
}
