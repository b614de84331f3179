#version 450 core
// glTF primitives (texstream.scene.gltf): positions, normals, TEXCOORD_0 and, when the file has
// them, tangents; placed by the node's world matrix and the camera. Attributes a primitive lacks
// keep GL's default (0, 0, 0, 1): uv (0, 0), and u_has_tangents says whether in_tangent is real.
uniform mat4 u_view_proj;     // projection x view x the caller's root transform
uniform mat4 u_model;         // the node's world matrix
uniform mat3 u_normal_matrix; // inverse transpose of u_model's upper 3 x 3
in vec3 in_position;
in vec3 in_normal;
in vec2 in_uv;
in vec4 in_tangent;           // xyz: tangent, w: handedness of the bitangent (glTF TANGENT)
out vec3 v_world;
out vec3 v_normal;
out vec2 v_uv;
out vec4 v_tangent;

void main() {
    vec4 world = u_model * vec4(in_position, 1.0);
    v_world = world.xyz;
    v_normal = u_normal_matrix * in_normal;
    v_tangent = vec4(mat3(u_model) * in_tangent.xyz, in_tangent.w);
    v_uv = in_uv;                 // glTF: v = 0 is the image's top row; the textures open TOP_LEFT
    gl_Position = u_view_proj * world;
}
