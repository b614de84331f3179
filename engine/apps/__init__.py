"""The programs built on the library: the command line (`cli`), the demo, headless rendering, the
benchmarks and the built-in assets. Nothing in the library imports from here."""
