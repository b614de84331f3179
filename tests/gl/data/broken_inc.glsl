// a semantic error on line 5
float broken_ok(float x) {
    return x;
}
float broken_value = undefined_thing * 2.0;
