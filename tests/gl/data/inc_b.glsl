#pragma once
// included by inc_a.glsl and others
float inc_b(float x) {
    return x + 1.0;
}
