"""Shader compile and link errors mapped back to their files: `ShaderCompileError` with `Diagnostic`s.

`compile_program(build, sources)` runs a build (moderngl's `program` or `compute_shader`) and turns
its failure into one `ShaderCompileError` naming file:line and the offending source line: the build
is retried without ``#line`` directives so line numbers map back exactly on every driver, the
driver's log is parsed (Mesa, NVIDIA, AMD and Intel forms), and a stage that uses vt.glsl's names
without including it is told which include to add.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import moderngl

from ..errors import ShaderError

__all__ = ["VT_INCLUDE", "Diagnostic", "ShaderCompileError", "compile_program", "error_from_log"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

MAX_DIAGNOSTICS = 8
VT_INCLUDE = "texstream/vt.glsl"
# Uses of vt.glsl's API, for the hint when a shader forgot its #include.
_VT_USE = re.compile(r"\b(VT_DECLARE|VT_SAMPLE|VTInfo|vt_sample\w*|vt_lookup|vt_debug_tint)\b")

# Driver log forms: Mesa "0:12(5): error", NVIDIA "0(12) : error", AMD/Intel "ERROR: 0:12: ...".
_LOG_FORMS = (
    re.compile(r"^\s*(?:ERROR|WARNING):\s*(?P<file>\d+):(?P<line>\d+):\s*(?P<msg>.*)$"),
    re.compile(r"^\s*(?P<file>\d+):(?P<line>\d+)\(\d+\):\s*(?P<msg>.*)$"),
    re.compile(r"^\s*(?P<file>\d+)\((?P<line>\d+)\)\s*:\s*(?P<msg>.*)$"),
)
_MODERNGL_STAGES = {
    "vertex_shader": "vertex",
    "fragment_shader": "fragment",
    "geometry_shader": "geometry",
    "tess_control_shader": "tess_control",
    "tess_evaluation_shader": "tess_evaluation",
    "compute_shader": "compute",
}


class SourceMap(Protocol):
    """What error mapping needs of a preprocessed stage (`shaders.ShaderSource`)."""

    files: tuple[str, ...]
    file_lines: tuple[tuple[str, ...], ...]

    def locate(self, file_id: int, line: int) -> tuple[str, int, str] | None: ...

    def locate_flat(self, line: int) -> tuple[str, int, str] | None: ...


@dataclass(frozen=True)
class Diagnostic:
    """One compiler message mapped back to its file."""

    stage: str
    file: str
    line: int
    message: str
    source_line: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}\n    {self.line} | {self.source_line}"


class ShaderCompileError(ShaderError):
    """A stage failed to compile or the program failed to link; ``diagnostics`` holds the parsed log."""

    def __init__(self, message: str, stage: str, diagnostics: Sequence[Diagnostic] = (), log: str = "") -> None:
        super().__init__(message)
        self.stage = stage
        self.diagnostics = tuple(diagnostics)
        self.log = log


def compile_program(build: Callable[[bool], _T], sources: Mapping[str, SourceMap]) -> _T:
    try:
        return build(False)
    except moderngl.Error as exc:
        first_log = str(exc)
    # Compile once more without #line directives: flat line numbers map back exactly on every driver.
    flat_log = ""
    try:
        prog = build(True)
    except moderngl.Error as exc:
        flat_log = str(exc)
    else:  # pragma: no cover - the same code compiling differently would be a driver bug
        release = getattr(prog, "release", None)
        if release is not None:
            release()
    missing = _missing_vt_include(sources)
    if missing is not None:
        raise missing from None
    raise error_from_log(flat_log or first_log, sources, flat=bool(flat_log)) from None


def _missing_vt_include(sources: Mapping[str, SourceMap]) -> ShaderCompileError | None:
    """The error for a stage that failed to compile while using vt.glsl's names without including it."""
    for stage, src in sources.items():
        if VT_INCLUDE in src.files:
            continue
        for file_id, lines in enumerate(src.file_lines):
            for number, line in enumerate(lines, start=1):
                code = line.split("//", 1)[0]
                m = _VT_USE.search(code)
                if m is None:
                    continue
                where = f"{src.files[file_id]}:{number}"
                return ShaderCompileError(
                    f"{stage} shader uses {m.group(1)} ({where}) without texstream's sampling code: "
                    f'add #include "{VT_INCLUDE}" after #version\n    {number} | {line.strip()}',
                    stage,
                )
    return None


def _split_log(log_text: str) -> list[tuple[str, str]]:
    """moderngl's error text as (stage header, body) sections."""
    lines = log_text.splitlines()
    sections: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(lines):
        if i + 1 < len(lines) and lines[i + 1].strip() and set(lines[i + 1].strip()) == {"="}:
            sections.append((lines[i].strip(), []))
            i += 2
            continue
        if sections:
            sections[-1][1].append(lines[i])
        i += 1
    return [(h, "\n".join(b).strip()) for h, b in sections]


def error_from_log(log_text: str, sources: Mapping[str, SourceMap], flat: bool) -> ShaderCompileError:
    linking = "Linker failed" in log_text
    sections = _split_log(log_text) or [("", log_text.strip())]
    diagnostics: list[Diagnostic] = []
    stage_name = "program" if linking else next(iter(sources))
    for header, body in sections:
        stage = _MODERNGL_STAGES.get(header)
        if stage is not None:
            stage_name = stage
        src = sources.get(stage) if stage else None
        for raw in body.splitlines():
            for form in _LOG_FORMS:
                m = form.match(raw)
                if m is None:
                    continue
                file_id, line, msg = int(m.group("file")), int(m.group("line")), m.group("msg").strip()
                if raw.lstrip().startswith(("ERROR", "WARNING")):  # AMD: the severity leads the line
                    msg = f"{raw.split(':', 1)[0].strip().lower()}: {msg}"
                where: tuple[str, int, str] | None = None
                if src is not None:
                    where = src.locate_flat(line) if flat else src.locate(file_id, line)
                if where is None:
                    where = (f"<{stage or 'shader'}>", line, "")
                diagnostics.append(Diagnostic(stage or "shader", where[0], where[1], msg, where[2]))
                break
    # errors first (drivers interleave warnings), each group in log order
    diagnostics.sort(key=lambda d: d.message.lower().startswith("warning"))
    kind = "link" if linking else "compile"
    if diagnostics:
        shown = diagnostics[:MAX_DIAGNOSTICS]
        more = len(diagnostics) - len(shown)
        head = f"{stage_name} shader failed to {kind}: {shown[0]}"
        rest = [str(d) for d in shown[1:]] + ([f"... and {more} more"] if more else [])
        message = "\n".join([head, *rest])
    else:
        body = "; ".join(b.replace("\n", "; ") for _, b in sections if b) or log_text.strip()
        files = ", ".join(p.files[0] for p in sources.values())
        message = f"{stage_name} failed to {kind} ({files}): {body}"
    log.debug("shader %s error, driver log:\n%s", kind, log_text)
    return ShaderCompileError(message, stage_name, diagnostics, log_text)
