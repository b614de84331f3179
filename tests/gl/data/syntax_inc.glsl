// a syntax error on line 3
float syntax_ok = 1.0;
float syntax_bad = 2.0 +;
