"""Raw GL that moderngl lacks (`gl_ext`) and the GLSL loader (`shaders`); render thread only."""

from __future__ import annotations

from .gl_ext import (
    Feature,
    Fence,
    FenceLike,
    GLExt,
    GLFormat,
    GpuMemoryInfo,
    GpuTimer,
    MappedBuffer,
    TextureArray,
    gl_format,
)
from .shaders import ShaderCompileError, ShaderSource, compute_shader, load_source, preprocess, program

__all__ = [
    "Feature",
    "Fence",
    "FenceLike",
    "GLExt",
    "GLFormat",
    "GpuMemoryInfo",
    "GpuTimer",
    "MappedBuffer",
    "ShaderCompileError",
    "ShaderSource",
    "TextureArray",
    "compute_shader",
    "gl_format",
    "load_source",
    "preprocess",
    "program",
]
