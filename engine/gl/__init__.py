"""Raw GL that moderngl lacks and the GLSL loader (`shaders`); render thread only.

The raw GL is split by job: `gl_ext` (the `GLExt` facade), `enums` (enum values and texel-format
tables), `loader` (features and entry points) and `objects` (the GL objects `GLExt` hands out).
"""

from __future__ import annotations

from .enums import GLFormat, gl_format
from .gl_ext import GLExt
from .loader import Feature, GLFunctions
from .objects import Fence, FenceLike, GpuMemoryInfo, GpuTimer, MappedBuffer, ObjectOwner, TextureArray
from .shaders import ShaderCompileError, ShaderSource, compute_shader, load_source, preprocess, program

__all__ = [
    "Feature",
    "Fence",
    "FenceLike",
    "GLExt",
    "GLFormat",
    "GLFunctions",
    "GpuMemoryInfo",
    "GpuTimer",
    "MappedBuffer",
    "ObjectOwner",
    "ShaderCompileError",
    "ShaderSource",
    "TextureArray",
    "compute_shader",
    "gl_format",
    "load_source",
    "preprocess",
    "program",
]
