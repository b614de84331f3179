#version 330 core
// texstream telemetry overlay: straight-alpha colour, blended SRC_ALPHA / ONE_MINUS_SRC_ALPHA.

#define MODE_SOLID 0
#define MODE_GLYPH 1
#define MODE_MINIMAP 2

uniform sampler2D u_font;     // R8 glyph coverage, fetched texel-exact (quads are pixel aligned)
uniform sampler2D u_minimap;  // RGBA8 residency colours, nearest filtering

in vec2 v_uv;
in vec4 v_color;
flat in int v_mode;

out vec4 f_color;

void main() {
    if (v_mode == MODE_GLYPH) {
        float coverage = texelFetch(u_font, ivec2(floor(v_uv)), 0).r;
        f_color = vec4(v_color.rgb, v_color.a * coverage);
    } else if (v_mode == MODE_MINIMAP) {
        f_color = texture(u_minimap, v_uv) * v_color;
    } else {
        f_color = v_color;
    }
}
