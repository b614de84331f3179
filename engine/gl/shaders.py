"""GLSL loading: ``#include`` resolution, ``#line`` directives, and compile errors as `ShaderError`.

Shader files live in the ``shaders/`` folder, shipped as the package ``texstream.shaders``. A file
or a source string may include others::

    #include "vt.glsl"              // a texstream shader (or a file next to the including one)
    #include "texstream/vt.glsl"    // explicitly a texstream shader, from anywhere

so a user's own shader string can pull in texstream's GLSL (moderngl's keyword names work too)::

    prog = texstream.program(ctx, vertex_shader=MY_VS, fragment_shader='''
        #version 450
        #include "texstream/vt.glsl"
        ...
    ''')

A stage is GLSL source when given as a string, and a file when given as a path
(``fragment_path=Path("my.frag")``, any ``os.PathLike``) or as ``shader_file("my.frag")``; a
one-line string that names a shader file is refused with that advice rather than guessed at.

`register_includes` puts texstream's includable shaders (``texstream/vt.glsl``,
``texstream/common.glsl``) into moderngl's ``ctx.includes``, so plain ``ctx.program()`` resolves
them as well; a `Streamer` does it for its context.

Resolution order for ``#include "path"``: a ``texstream/`` prefix means the texstream shader folder;
otherwise the including file's own folder, then each of `include_dirs` (user folders on disk), then
the texstream shader folder. ``#pragma once`` in a file makes later includes of it empty; classic
``#ifndef`` guards work too. Includes are resolved before the GLSL preprocessor runs, so an include
inside ``#if 0`` is still read (but its text is compiled out). Only the top-level source may hold
``#version``; defines given to the loader are inserted right after it.

Every file gets an id (0 is the top-level source) and ``#line N ID`` directives keep the driver's
line numbers pointing at the original files. Drivers do not all honour the file id (Mesa reports
0 for most semantic errors), so on a compile failure the loader compiles the same text once more
without ``#line`` directives and maps the flat line numbers back through its own table; the
resulting `ShaderError` names ``file:line`` and quotes the offending source line.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TypeVar

import moderngl

from ..errors import ShaderError
from .shader_errors import Diagnostic, ShaderCompileError, compile_program
from .shader_root import PACKAGE_PREFIX, shader_root

__all__ = [
    "INCLUDABLE",
    "Diagnostic",
    "ShaderCompileError",
    "ShaderFile",
    "ShaderSource",
    "compute_shader",
    "load_source",
    "preprocess",
    "program",
    "register_includes",
    "shader_file",
    "shader_root",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

MAX_INCLUDE_DEPTH = 32

_INCLUDE = re.compile(r'^\s*#\s*include\s+"(?P<path>[^"]+)"\s*(//.*)?$')
_INCLUDE_ANY = re.compile(r"^\s*#\s*include\b")
_DEFUSE = re.compile(r"#\s*include\b")
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*(//.*)?$")
_VERSION = re.compile(r"^\s*#\s*version\s+(?P<number>\d+)")
# A one-line stage string that is a file name, not GLSL: no spaces, braces or semicolons, a suffix.
_LOOKS_LIKE_FILE = re.compile(r"^[\w./\\-]+\.(glsl|vert|frag|geom|tesc|tese|comp|vs|fs|gs|cs)$", re.IGNORECASE)
# The shipped shaders meant for inclusion (no #version of their own), as `register_includes` names them.
INCLUDABLE = ("texstream/common.glsl", "texstream/vt.glsl")


# ---- sources ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _File:
    key: str  # identity for cycles and #pragma once: "texstream:vt.glsl", an absolute path, "<vertex>"
    display: str  # what error messages call it
    lines: tuple[str, ...]
    # where relative includes resolve: a folder inside texstream's shaders ("" is the top), a folder
    # on disk, or None (source strings have no folder of their own)
    folder: str | Path | None


@dataclass(frozen=True)
class ShaderSource:
    """A preprocessed shader: the text to compile and the table back to the original files."""

    text: str  # with #line directives
    flat_text: str  # the same lines without #line directives
    files: tuple[str, ...]  # file id -> display name (id 0: the top-level source)
    flat_map: tuple[tuple[int, int], ...]  # flat line (1-based, index + 1) -> (file id, line)
    file_lines: tuple[tuple[str, ...], ...] = field(repr=False)  # file id -> its source lines

    def locate(self, file_id: int, line: int) -> tuple[str, int, str]:
        """(file name, line, source text) of `line` in file `file_id` ("<file N>" / "" when unknown)."""
        if not 0 <= file_id < len(self.files):
            return f"<file {file_id}>", line, ""
        lines = self.file_lines[file_id]
        text = lines[line - 1].strip() if 1 <= line <= len(lines) else ""
        return self.files[file_id], line, text

    def locate_flat(self, flat_line: int) -> tuple[str, int, str] | None:
        """Map a line of `flat_text` back to (file, line, source text); None for synthetic lines."""
        if not 1 <= flat_line <= len(self.flat_map):
            return None
        file_id, line = self.flat_map[flat_line - 1]
        return None if file_id < 0 else self.locate(file_id, line)


class _Preprocessor:
    def __init__(self, include_dirs: Sequence[Path | str], defines: Mapping[str, object] | None) -> None:
        self.root = shader_root()
        self.include_dirs = [Path(d) for d in include_dirs]
        self.defines = dict(defines or {})
        for name in self.defines:
            if not re.fullmatch(r"[A-Za-z_]\w*", name):
                raise ValueError(f"define name {name!r} is not a GLSL identifier")
        self.files: list[_File] = []
        self.ids: dict[str, int] = {}
        self.once: set[str] = set()
        # output rows: (text, file id or -1 for synthetic, line, is_line_directive)
        self.rows: list[tuple[str, int, int, bool]] = []
        self.line_base = 0  # GLSL < 330: "#line N" names the line *before* the next one

    def run(self, top: _File) -> ShaderSource:
        self._add_file(top)
        version_index = next((i for i, ln in enumerate(top.lines) if _VERSION.match(ln)), None)
        if version_index is not None:
            number = int(_VERSION.match(top.lines[version_index]).group("number"))  # type: ignore[union-attr]
            self.line_base = 0 if number >= 330 else -1
        if version_index is None and self.defines:
            for name, value in self.defines.items():
                self.rows.append((f"#define {name} {_define_value(value)}", -1, 0, False))
            self._line(1, 0)
        self._emit_file(top, [], version_index)
        text = "\n".join(r[0] for r in self.rows) + "\n"
        flat_rows = [r for r in self.rows if not r[3]]
        return ShaderSource(
            text=text,
            flat_text="\n".join(r[0] for r in flat_rows) + "\n",
            files=tuple(f.display for f in self.files),
            flat_map=tuple((r[1], r[2]) for r in flat_rows),
            file_lines=tuple(f.lines for f in self.files),
        )

    def _add_file(self, f: _File) -> int:
        if f.key not in self.ids:
            self.ids[f.key] = len(self.files)
            self.files.append(f)
        return self.ids[f.key]

    def _line(self, n: int, file_id: int) -> None:
        self.rows.append((f"#line {n + self.line_base} {file_id}", -1, 0, True))

    def _emit_file(self, f: _File, stack: list[tuple[_File, int]], version_index: int | None = None) -> None:
        file_id = self.ids[f.key]
        for number, line in enumerate(f.lines, start=1):
            if version_index is not None and number == version_index + 1:
                self.rows.append((line, file_id, number, False))
                for name, value in self.defines.items():
                    self.rows.append((f"#define {name} {_define_value(value)}", -1, 0, False))
                if self.defines:
                    self._line(number + 1, file_id)
                continue
            if _VERSION.match(line) and stack:
                raise self._error(f, number, "#version is only allowed in the top-level shader, not in an include")
            if _PRAGMA_ONCE.match(line):
                self.once.add(f.key)
                self.rows.append(("", file_id, number, False))
                continue
            m = _INCLUDE.match(line)
            if m is None:
                if _INCLUDE_ANY.match(line):
                    raise self._error(f, number, 'malformed #include: write #include "file.glsl"')
                # What is left of "#include" is comment text; moderngl's own include pass would still
                # try to resolve it (its regex ignores comments), so it is defused.
                self.rows.append((_DEFUSE.sub("# include", line), file_id, number, False))
                continue
            child = self._resolve(m.group("path"), f, number)
            chain = [*stack, (f, number)]
            if any(parent.key == child.key for parent, _ in chain):
                names = " -> ".join([p.display for p, _ in chain] + [child.display])
                raise self._error(f, number, f"#include cycle: {names}")
            if len(chain) > MAX_INCLUDE_DEPTH:
                raise self._error(f, number, f"#include nesting deeper than {MAX_INCLUDE_DEPTH}")
            if child.key in self.once:
                self.rows.append(("", file_id, number, False))
                continue
            child_id = self._add_file(child)
            self.rows.append((f"// begin {child.display}", file_id, number, False))
            self._line(1, child_id)
            self._emit_file(child, chain)
            self._line(number, file_id)
            self.rows.append((f"// end {child.display}", file_id, number, False))

    def _resolve(self, path: str, parent: _File, number: int) -> _File:
        if posixpath.isabs(path) or Path(path).is_absolute():
            raise self._error(parent, number, f"#include path {path!r} must be relative")
        norm = posixpath.normpath(path)
        candidates: list[str | Path] = []  # package-relative paths (str) or files on disk (Path)
        if norm.startswith(PACKAGE_PREFIX):
            candidates.append(norm[len(PACKAGE_PREFIX) :])
        else:
            if isinstance(parent.folder, str):
                candidates.append(posixpath.normpath(posixpath.join(parent.folder, norm)))
            elif isinstance(parent.folder, Path):
                candidates.append((parent.folder / norm).resolve())
            candidates.extend((Path(d) / norm).resolve() for d in self.include_dirs)
            candidates.append(norm)
        candidates = list(dict.fromkeys(candidates))
        for cand in candidates:
            found = _open(self.root, cand)
            if found is not None:
                return found
        where = ", ".join(_display_of(c) for c in candidates)
        raise self._error(parent, number, f"cannot find #include {path!r} (looked for {where})")

    def _error(self, f: _File, number: int, message: str) -> ShaderError:
        text = f.lines[number - 1].strip() if 1 <= number <= len(f.lines) else ""
        return ShaderError(f"{f.display}:{number}: {message}\n    {number} | {text}")


def _define_value(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    text = str(value)
    if "\n" in text:
        raise ValueError(f"define value {value!r} spans lines")
    return text


def _display_of(cand: str | Path) -> str:
    """texstream/x.glsl for package files; a disk path relative to the working folder when inside it."""
    if isinstance(cand, str):
        return f"{PACKAGE_PREFIX}{cand}"
    try:
        return cand.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(cand)


def _open(root: Traversable, cand: str | Path, display: str | None = None) -> _File | None:
    """Read a package-relative shader (str) or a file on disk (Path); None when it does not exist."""
    if isinstance(cand, Path):
        if not cand.is_file():
            return None
        node: Traversable | Path = cand
        folder: str | Path = cand.parent
        key = str(cand)
    else:
        if cand.startswith("..") or cand.startswith("/"):
            return None  # outside the shader folder
        node = root
        for part in cand.split("/"):
            node = node.joinpath(part)
        if not node.is_file():
            return None
        key, folder = f"texstream:{cand}", posixpath.dirname(cand)
    display = display or _display_of(cand)
    try:
        text = node.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ShaderError(f"cannot read shader {display}: {exc}") from None
    return _File(key, display, tuple(text.splitlines()), folder)


@dataclass(frozen=True)
class ShaderFile:
    """A shader stage given as a file rather than as source text: see `shader_file`."""

    path: str | Path


StageArg = str | ShaderFile | os.PathLike
"""A stage argument: GLSL source (str), or a file (`ShaderFile`, any path-like)."""


def shader_file(path: str | os.PathLike[str]) -> ShaderFile:
    """Mark a stage argument as a file to read, not source text.

    Parameters
    ----------
    path : str or os.PathLike
        An absolute path; a relative one, looked up in the ``include_dirs`` given with it, then in
        the working folder, then among texstream's shipped shaders; or ``"texstream/<name>"``,
        one of texstream's shipped shaders only.

    Returns
    -------
    ShaderFile
        For any stage argument of `program`, `preprocess` or `compute_shader`.
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"shader_file() takes a path, got {type(path).__name__}")
    return ShaderFile(path)


def _top_file(stage: StageArg, name: str | None, include_dirs: Sequence[Path | str], what: str = "shader") -> _File:
    if isinstance(stage, str):
        stripped = stage.strip()
        if "\n" not in stripped and _LOOKS_LIKE_FILE.match(stripped):
            raise ShaderError(
                f"{what} {stage!r} is a file name, and a string is GLSL source: pass the file as "
                f"shader_file({stage!r}) or a pathlib.Path"
            )
        display = name or "<source>"
        return _File(f"<{display}>", display, tuple(stage.splitlines()), None)
    if isinstance(stage, ShaderFile):
        return _find_file(str(stage.path) if isinstance(stage.path, str) else Path(stage.path), name, include_dirs)
    if isinstance(stage, os.PathLike):
        return _find_file(Path(stage), name, include_dirs)
    raise TypeError(
        f"{what} must be GLSL source (str) or a file (shader_file(), pathlib.Path), got {type(stage).__name__}"
    )


def _find_file(path: str | Path, name: str | None, include_dirs: Sequence[Path | str]) -> _File:
    # A file: absolute, in a user folder, relative to the working folder, or in texstream's folder
    # (texstream/ prefix optional; with it, only there).
    root = shader_root()
    source_or_name = str(path)
    rel = posixpath.normpath(source_or_name.replace(os.sep, "/"))
    candidates: list[str | Path] = []
    if rel.startswith(PACKAGE_PREFIX):
        candidates.append(rel[len(PACKAGE_PREFIX) :])
    elif Path(source_or_name).is_absolute():
        candidates.append(Path(source_or_name).resolve())
    else:
        candidates.extend((Path(d) / rel).resolve() for d in include_dirs)
        candidates.append(Path(rel).resolve())
        candidates.append(rel)
    for cand in candidates:
        found = _open(root, cand, name)
        if found is not None:
            return found
    looked = ", ".join(_display_of(c) for c in candidates)
    raise ShaderError(f"cannot find shader file {source_or_name!r} (looked for {looked})")


def preprocess(
    source: StageArg,
    *,
    name: str | None = None,
    defines: Mapping[str, object] | None = None,
    include_dirs: Sequence[Path | str] = (),
) -> ShaderSource:
    """Resolve ``#include`` directives and add ``#line`` markers, so compiler errors name the file.

    Parameters
    ----------
    source : str, ShaderFile or os.PathLike
        GLSL source (a string), or a file (`shader_file`, a path): looked up as given, in
        `include_dirs`, then among the shaders shipped with texstream (``vt.glsl`` and friends).
    name : str, optional
        The name a source string is reported under in errors.
    defines : mapping, optional
        ``#define NAME value`` lines inserted after ``#version``.
    include_dirs : sequence of path-like, optional
        Folders searched for includes before the shipped shaders; ``#include "texstream/vt.glsl"``
        always finds texstream's own.

    Returns
    -------
    ShaderSource
        The resolved text and its line map.

    Raises
    ------
    ShaderError
        A missing file or include, an include cycle (the message names file and line), or a
        one-line string naming a file (pass `shader_file` instead).
    """
    top = _top_file(source, name, include_dirs)
    return _Preprocessor(include_dirs, defines).run(top)


def load_source(
    name: str,
    *,
    defines: Mapping[str, object] | None = None,
    include_dirs: Sequence[Path | str] = (),
) -> str:
    """The text of shader file `name` with every ``#include`` resolved and ``#line`` directives added."""
    return preprocess(ShaderFile(name), defines=defines, include_dirs=include_dirs).text


def register_includes(ctx: moderngl.Context) -> None:
    """Make ``#include "texstream/vt.glsl"`` (and ``texstream/common.glsl``) work in plain
    ``ctx.program()`` calls, through moderngl's ``ctx.includes``, and in moderngl-window's
    ``load_program`` when moderngl-window is imported (its shader finders learn ``texstream/``).
    A `Streamer` does this for its context; calling it again is harmless.

    Parameters
    ----------
    ctx : moderngl.Context
        The context whose ``includes`` gain texstream's shaders.
    """
    for name in INCLUDABLE:
        if name not in ctx.includes:
            ctx.includes[name] = preprocess(ShaderFile(name)).flat_text
    if "moderngl_window" in sys.modules:  # only where the application uses it: never imported here
        from .window_finder import register_finder

        register_finder()


# ---- compiling --------------------------------------------------------------------------------
_STAGES = ("vertex", "fragment", "geometry", "tess_control", "tess_evaluation")


def program(
    ctx: moderngl.Context,
    *,
    vertex_shader: StageArg | None = None,
    fragment_shader: StageArg | None = None,
    geometry_shader: StageArg | None = None,
    tess_control_shader: StageArg | None = None,
    tess_evaluation_shader: StageArg | None = None,
    vertex: StageArg | None = None,
    fragment: StageArg | None = None,
    geometry: StageArg | None = None,
    tess_control: StageArg | None = None,
    tess_evaluation: StageArg | None = None,
    vertex_path: str | os.PathLike[str] | None = None,
    fragment_path: str | os.PathLike[str] | None = None,
    geometry_path: str | os.PathLike[str] | None = None,
    tess_control_path: str | os.PathLike[str] | None = None,
    tess_evaluation_path: str | os.PathLike[str] | None = None,
    varyings: Sequence[str] = (),
    fragment_outputs: Mapping[str, int] | None = None,
    defines: Mapping[str, object] | None = None,
    include_dirs: Sequence[Path | str] = (),
) -> moderngl.Program:
    """Preprocess each stage and link them into a moderngl program: ``ctx.program`` with texstream's
    ``#include`` resolution, ``#line`` bookkeeping and `ShaderError` messages that name file:line.

    Each stage is given once, by moderngl's keyword (``vertex_shader=``), by its short name
    (``vertex=``) or as a file (``vertex_path=``).

    Parameters
    ----------
    ctx : moderngl.Context
        The context to compile in.
    vertex_shader, fragment_shader, geometry_shader, tess_control_shader, tess_evaluation_shader : str or path
        Each stage as GLSL source (a string) or a file (`shader_file`, any ``os.PathLike``); only
        the vertex stage is required.
    vertex, fragment, geometry, tess_control, tess_evaluation : str, ShaderFile or os.PathLike
        The same stages under their short names.
    vertex_path, fragment_path, geometry_path, tess_control_path, tess_evaluation_path : str or os.PathLike
        A stage as a file to read (see `shader_file` for where it is looked up).
    varyings : sequence of str, optional
        Transform-feedback outputs, as for ``ctx.program``.
    fragment_outputs : mapping of str to int, optional
        Fragment output locations, as for ``ctx.program``.
    defines : mapping, optional
        ``#define`` lines added to every stage.
    include_dirs : sequence of path-like, optional
        Folders searched for files and includes before the shipped shaders.

    Returns
    -------
    moderngl.Program

    Raises
    ------
    ShaderError
        A stage failed to preprocess, compile or link; the message names file:line and quotes the
        source line (`ShaderCompileError`). A one-line string naming a file is refused (pass it as
        a path), and a shader that uses ``VT_*`` without ``#include "texstream/vt.glsl"`` is told so.
    TypeError
        A stage given twice, or no vertex stage.
    """
    given = {
        "shader": (vertex_shader, fragment_shader, geometry_shader, tess_control_shader, tess_evaluation_shader),
        "": (vertex, fragment, geometry, tess_control, tess_evaluation),
        "path": (vertex_path, fragment_path, geometry_path, tess_control_path, tess_evaluation_path),
    }
    stages: dict[str, StageArg] = {}
    for suffix, values in given.items():
        for stage, value in zip(_STAGES, values, strict=True):
            if value is None:
                continue
            if stage in stages:
                raise TypeError(
                    f"the {stage} stage is given twice (use one of {stage}_shader=, {stage}=, {stage}_path=)"
                )
            if suffix == "path":
                if not isinstance(value, str | os.PathLike):
                    raise TypeError(f"{stage}_path must be a path, got {type(value).__name__}")
                value = ShaderFile(value)
            stages[stage] = value
    if "vertex" not in stages:
        raise TypeError("program() needs a vertex stage (vertex_shader=, vertex= or vertex_path=)")
    sources = {
        stage: _preprocess_stage(stage, src, defines=defines, include_dirs=include_dirs)
        for stage, src in stages.items()
    }

    def build(flat: bool) -> moderngl.Program:
        texts = {s: (p.flat_text if flat else p.text) for s, p in sources.items()}
        return ctx.program(
            vertex_shader=texts["vertex"],
            fragment_shader=texts.get("fragment"),
            geometry_shader=texts.get("geometry"),
            tess_control_shader=texts.get("tess_control"),
            tess_evaluation_shader=texts.get("tess_evaluation"),
            varyings=tuple(varyings),
            fragment_outputs=dict(fragment_outputs) if fragment_outputs else None,
        )

    return compile_program(build, sources)


def _preprocess_stage(
    stage: str, source: StageArg, *, defines: Mapping[str, object] | None, include_dirs: Sequence[Path | str]
) -> ShaderSource:
    top = _top_file(source, f"<{stage}>" if isinstance(source, str) else None, include_dirs, f"the {stage} stage")
    return _Preprocessor(include_dirs, defines).run(top)


def compute_shader(
    ctx: moderngl.Context,
    source: StageArg,
    *,
    defines: Mapping[str, object] | None = None,
    include_dirs: Sequence[Path | str] = (),
) -> moderngl.ComputeShader:
    """Preprocess and compile a compute shader (file name or source string)."""
    src = _preprocess_stage("compute", source, defines=defines, include_dirs=include_dirs)
    return compile_program(lambda flat: ctx.compute_shader(src.flat_text if flat else src.text), {"compute": src})
