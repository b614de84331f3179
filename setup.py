"""Builds texstream's optional compiled helper; everything else is configured in pyproject.toml.

`optional=True`: without a C compiler the install still succeeds and texstream uses its pure-Python
loops (same results, more interpreter-lock contention between the render and I/O threads).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "texstream.native._native",
            ["engine/native/_native.c"],
            optional=True,
            # sqrtf without errno inlines to one instruction and lets the procedural loops vectorize;
            # results are the same (every argument is >= 0).
            # -pthread: the compiled I/O threads (ts_pool_*) are POSIX threads.
            extra_compile_args=["-O2", "-fno-math-errno", "-pthread"],
            extra_link_args=["-pthread"],
        )
    ]
)
