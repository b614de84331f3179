#version 330 core
// texstream telemetry overlay: screen-space quads in framebuffer pixels (origin top-left).
// One vertex layout for every element: solid geometry, glyphs (font atlas) and residency minimaps.

in vec2 in_pos;    // framebuffer pixels, y down
in vec2 in_uv;     // glyphs: font-atlas texels; minimaps: normalized minimap-atlas coordinates
in vec4 in_color;  // straight (not premultiplied) RGBA
in float in_mode;  // 0 solid, 1 glyph, 2 minimap

uniform vec2 u_fb_size;

out vec2 v_uv;
out vec4 v_color;
flat out int v_mode;

void main() {
    vec2 ndc = in_pos / u_fb_size * 2.0 - 1.0;
    gl_Position = vec4(ndc.x, -ndc.y, 0.0, 1.0);
    v_uv = in_uv;
    v_color = in_color;
    v_mode = int(in_mode + 0.5);
}
