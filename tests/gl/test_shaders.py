"""The GLSL loader: #include resolution, #line bookkeeping, and compile errors as ShaderError."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import moderngl
import pytest

import texstream as ts
from texstream.errors import ShaderError
from texstream.gl import shaders
from texstream.gl.shaders import ShaderCompileError, ShaderSource, load_source, preprocess

from .helpers import DATA

VS_HEAD = "#version 330\n"
MAIN = "void main() { gl_Position = vec4(1.0); }\n"


def user(body: str) -> str:
    return VS_HEAD + body + "\n" + MAIN


def display(name: str) -> str:
    """How the loader names a data file in messages (relative to the working folder when inside it)."""
    return shaders._display_of((DATA / name).resolve())


# ---- preprocessing (no GL) --------------------------------------------------------------------
def test_package_shaders_are_found_by_name() -> None:
    text = load_source("common.glsl")
    assert "ts_srgb_to_linear" in text
    assert load_source("texstream/common.glsl") == text


def test_user_string_includes_texstream_shaders_both_ways() -> None:
    for path in ("texstream/common.glsl", "common.glsl"):
        src = preprocess(user(f'#include "{path}"'))
        assert "ts_fullscreen_position" in src.text
        assert src.files == ("<source>", "texstream/common.glsl")


def test_includes_resolve_recursively_with_line_directives() -> None:
    src = preprocess(user('#include "inc_a.glsl"'), include_dirs=[DATA], name="main.vert")
    assert [f.rsplit("/", 1)[-1] for f in src.files] == ["main.vert", "inc_a.glsl", "inc_b.glsl"]
    lines = src.text.splitlines()
    assert lines[0] == "#version 330"
    # each included file starts at its line 1 under its own id; the includer resumes after it
    assert "#line 1 1" in lines and "#line 1 2" in lines
    a_body = lines.index("float inc_a(float x) { return inc_b(x) * 2.0; }")
    assert lines[a_body - 2] == "#line 2 1"  # back in inc_a.glsl: "// end" comment on line 2, body on 3
    assert "#line" not in src.flat_text
    # every flat line maps back to its file and line
    flat = src.flat_text.splitlines()
    for i, text in enumerate(flat, start=1):
        where = src.locate_flat(i)
        if where is not None and text and not text.startswith("// "):
            assert where[2] == text.strip(), (i, text, where)


def test_line_directives_match_the_drivers_numbering() -> None:
    """GLSL >= 330 numbers the line after "#line N" as N; older versions as N + 1."""
    new = preprocess('#version 330\n#include "texstream/common.glsl"\n').text.splitlines()
    old = preprocess('#version 150\n#include "texstream/common.glsl"\n').text.splitlines()
    assert "#line 1 1" in new and "#line 0 1" in old


def test_pragma_once_includes_a_file_once() -> None:
    src = preprocess(user('#include "inc_b.glsl"\n#include "inc_a.glsl"\n#include "inc_b.glsl"'), include_dirs=[DATA])
    assert src.text.count("float inc_b(float x)") == 1
    assert "#pragma once" not in src.text


def test_relative_includes_climb_out_of_subfolders() -> None:
    src = preprocess(user('#include "sub/nested.glsl"'), include_dirs=[DATA])
    assert "float inc_b(float x)" in src.text and "float nested(float x)" in src.text


def test_defines_follow_the_version_line() -> None:
    src = preprocess(user("float x = float(TILE);"), defines={"TILE": 128, "FLAG": True})
    lines = src.text.splitlines()
    assert lines[:4] == ["#version 330", "#define TILE 128", "#define FLAG 1", "#line 2 0"]
    with pytest.raises(ValueError, match="not a GLSL identifier"):
        preprocess(user(""), defines={"2bad": 1})


def test_include_cycle_is_an_error_naming_the_chain() -> None:
    with pytest.raises(ShaderError) as info:
        preprocess(user('#include "cycle_a.glsl"'), include_dirs=[DATA])
    msg = str(info.value)
    assert "cycle" in msg and msg.startswith(f"{display('cycle_b.glsl')}:3:")
    assert "cycle_a.glsl -> " in msg and '#include "cycle_a.glsl"' in msg


def test_missing_include_names_file_line_and_where_it_looked() -> None:
    with pytest.raises(ShaderError) as info:
        preprocess(user('#include "missing_inc.glsl"'), include_dirs=[DATA])
    msg = str(info.value)
    assert msg.startswith(f"{display('missing_inc.glsl')}:2: cannot find #include 'does_not_exist.glsl'")
    assert "texstream/does_not_exist.glsl" in msg and '2 | #include "does_not_exist.glsl"' in msg


def test_version_inside_an_include_is_an_error() -> None:
    with pytest.raises(ShaderError, match=r"versioned_inc.glsl:1: #version is only allowed"):
        preprocess(user('#include "versioned_inc.glsl"'), include_dirs=[DATA])


def test_bad_include_syntax_and_paths() -> None:
    with pytest.raises(ShaderError, match=r"<source>:2: malformed #include"):
        preprocess(user("#include <common.glsl>"))
    with pytest.raises(ShaderError, match="must be relative"):
        preprocess(user('#include "/etc/passwd"'))
    with pytest.raises(ShaderError, match="cannot find #include '../engine/__init__.py'"):
        preprocess(user('#include "../engine/__init__.py"'))  # never escapes the shader folder


def test_unknown_shader_file() -> None:
    with pytest.raises(ShaderError, match="cannot find shader file 'nope.glsl'"):
        load_source("nope.glsl")


def test_driver_log_forms_map_to_files() -> None:
    """Mesa, NVIDIA and AMD put file ids and lines differently; all map through the #line table."""
    src = preprocess(user('#include "broken_inc.glsl"'), include_dirs=[DATA])
    sources = {"vertex": src}
    logs = {
        "mesa": "0:{line}(22): error: `undefined_thing' undeclared",
        "nvidia": '0({line}) : error C1008: undefined variable "undefined_thing"',
        "amd": "ERROR: 0:{line}: 'undefined_thing' : undeclared identifier",
    }
    flat_line = next(i for i, t in enumerate(src.flat_text.splitlines(), 1) if "undefined_thing" in t)
    for form in logs.values():
        text = "GLSL Compiler failed\n\nvertex_shader\n=============\n" + form.format(line=flat_line) + "\n"
        err = shaders._to_error(text, sources, flat=True)
        assert err.diagnostics and err.diagnostics[0].file == display("broken_inc.glsl")
        assert err.diagnostics[0].line == 5
        assert err.diagnostics[0].source_line == "float broken_value = undefined_thing * 2.0;"
    # warnings that come first in the log do not hide the error
    text = (
        "GLSL Compiler failed\n\nvertex_shader\n=============\n"
        f"WARNING: 0:1: '' : version 330 is old\nERROR: 0:{flat_line}: 'undefined_thing' : undeclared\n"
    )
    err = shaders._to_error(text, sources, flat=True)
    assert [d.message.split(":")[0] for d in err.diagnostics] == ["error", "warning"]
    assert str(err).startswith(f"vertex shader failed to compile: {display('broken_inc.glsl')}:5: error:")
    # with #line directives honoured (file id 1 = broken_inc.glsl), the id/line pair maps directly
    text = "GLSL Compiler failed\n\nvertex_shader\n=============\n1(5) : error C1008: undefined variable\n"
    err = shaders._to_error(text, sources, flat=False)
    assert (err.diagnostics[0].file, err.diagnostics[0].line) == (display("broken_inc.glsl"), 5)


def test_source_map_handles_unknown_ids() -> None:
    src: ShaderSource = preprocess(user(""))
    assert src.locate(7, 3) == ("<file 7>", 3, "")
    assert src.locate_flat(10_000) is None


# ---- compiling (GL) ---------------------------------------------------------------------------
@pytest.mark.gl
def test_program_compiles_user_strings_with_includes(gl_context: moderngl.Context) -> None:
    prog = shaders.program(
        gl_context,
        vertex=user('#include "inc_a.glsl"\n#include "texstream/common.glsl"').replace(
            MAIN, "void main() { gl_Position = ts_fullscreen_position(gl_VertexID) * inc_a(1.0); }\n"
        ),
        fragment="#version 330\nout vec4 c;\nvoid main() { c = vec4(VALUE); }\n",
        defines={"VALUE": 0.5},
        include_dirs=[DATA],
    )
    prog.release()


@pytest.mark.gl
def test_semantic_error_in_an_include_names_its_file_and_line(gl_context: moderngl.Context) -> None:
    with pytest.raises(ShaderCompileError) as info:
        shaders.program(gl_context, vertex=user('#include "broken_inc.glsl"'), include_dirs=[DATA])
    err = info.value
    assert isinstance(err, ShaderError) and err.stage == "vertex"
    first = str(err).splitlines()
    assert first[0].startswith(f"vertex shader failed to compile: {display('broken_inc.glsl')}:5:")
    assert "undefined_thing" in first[0]
    assert first[1].strip() == "5 | float broken_value = undefined_thing * 2.0;"


@pytest.mark.gl
def test_syntax_error_in_an_include_names_its_file_and_line(gl_context: moderngl.Context) -> None:
    with pytest.raises(ShaderCompileError) as info:
        shaders.program(gl_context, vertex=user('#include "syntax_inc.glsl"'), include_dirs=[DATA])
    d = info.value.diagnostics[0]
    assert (d.file, d.line, d.source_line) == (display("syntax_inc.glsl"), 3, "float syntax_bad = 2.0 +;")
    assert f"{display('syntax_inc.glsl')}:3:" in str(info.value)


@pytest.mark.gl
def test_error_in_the_top_level_fragment_source(gl_context: moderngl.Context) -> None:
    fs = '#version 330\n#include "texstream/common.glsl"\nout vec4 c;\nvoid main() {\n    c = vec4(nope);\n}\n'
    with pytest.raises(ShaderCompileError) as info:
        shaders.program(gl_context, vertex=user(""), fragment=fs)
    assert info.value.stage == "fragment"
    assert str(info.value).startswith("fragment shader failed to compile: <fragment>:5:")
    assert "5 | c = vec4(nope);" in str(info.value)


@pytest.mark.gl
def test_link_error_is_a_shader_error(gl_context: moderngl.Context) -> None:
    vs = "#version 330\nout vec4 v;\nvoid main() { v = vec4(1.0); gl_Position = v; }\n"
    fs = "#version 330\nin vec3 v;\nout vec4 c;\nvoid main() { c = vec4(v, 1.0); }\n"
    with pytest.raises(ShaderCompileError) as info:
        shaders.program(gl_context, vertex=vs, fragment=fs)
    assert info.value.stage == "program" and "failed to link" in str(info.value)


@pytest.mark.gl
def test_compute_shader_errors_map_too(gl_context: moderngl.Context) -> None:
    if gl_context.version_code < 430:
        pytest.skip("compute shaders need GL 4.3")
    cs = '#version 430\n#include "texstream/common.glsl"\nlayout(local_size_x = 1) in;\n' + "void main() { x = 1; }\n"
    with pytest.raises(ShaderCompileError, match=r"<compute>:4: .*\n\s+4 \| void main\(\) \{ x = 1; \}"):
        shaders.compute_shader(gl_context, cs)
    ok = shaders.compute_shader(gl_context, cs.replace("x = 1;", "vec3 c = ts_srgb_to_linear(vec3(0.5));"))
    ok.release()


# ---- moderngl's habits ------------------------------------------------------------------------
VT_FS = """#version 450 core
#include "texstream/vt.glsl"
VT_DECLARE(u_vt)
in vec2 v_uv;
out vec4 f_color;
void main() { f_color = VT_SAMPLE(u_vt, v_uv); }
"""
VT_VS = """#version 450 core
#include "texstream/common.glsl"
out vec2 v_uv;
void main() { v_uv = ts_fullscreen_uv(gl_VertexID); gl_Position = ts_fullscreen_position(gl_VertexID); }
"""


@pytest.fixture
def fresh_context() -> Iterator[moderngl.Context]:
    """A context of its own: nothing registered in its ``includes`` yet."""
    ctx = moderngl.create_context(standalone=True, backend="egl", require=450)
    yield ctx
    ctx.release()


@pytest.mark.gl
def test_program_takes_modernlgs_keyword_names(gl_context: moderngl.Context) -> None:
    prog = ts.program(gl_context, vertex_shader=VT_VS, fragment_shader=VT_FS)
    assert "u_vt_cache" in prog
    prog.release()


@pytest.mark.gl
def test_program_takes_files_explicitly(
    gl_context: moderngl.Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my.vert").write_text(VT_VS)
    (tmp_path / "my.frag").write_text(VT_FS)
    monkeypatch.chdir(tmp_path)  # a relative file name is found in the working folder
    for prog in (
        ts.program(gl_context, vertex_path="my.vert", fragment_shader=ts.shader_file("my.frag")),
        ts.program(gl_context, vertex_path=tmp_path / "my.vert", fragment_path=str(tmp_path / "my.frag")),
        ts.program(gl_context, vertex=tmp_path / "my.vert", fragment_shader=ts.shader_file(tmp_path / "my.frag")),
        ts.program(
            gl_context, vertex=ts.shader_file("plane_vs.glsl"), fragment=ts.shader_file("texstream/plane_fs.glsl")
        ),
    ):
        assert "u_vt_cache" in prog
        prog.release()


@pytest.mark.gl
def test_a_file_name_string_is_not_taken_as_a_file(gl_context: moderngl.Context) -> None:
    with pytest.raises(ShaderError, match=r"'plane_vs.glsl' is a file name.*shader_file\('plane_vs.glsl'\)"):
        ts.program(gl_context, vertex_shader="plane_vs.glsl", fragment_shader=VT_FS)
    with pytest.raises(ShaderError, match="'my.frag' is a file name"):
        ts.preprocess("my.frag")


@pytest.mark.gl
def test_a_stage_given_twice_or_missing_is_a_type_error(gl_context: moderngl.Context) -> None:
    with pytest.raises(TypeError, match="vertex stage is given twice"):
        ts.program(gl_context, vertex_shader=VT_VS, vertex=VT_VS)
    with pytest.raises(TypeError, match="needs a vertex stage"):
        ts.program(gl_context, fragment_shader=VT_FS)


@pytest.mark.gl
def test_register_includes_makes_plain_ctx_program_work(fresh_context: moderngl.Context) -> None:
    with pytest.raises(KeyError):  # moderngl alone does not know texstream's includes
        fresh_context.program(vertex_shader=VT_VS, fragment_shader=VT_FS)
    ts.register_includes(fresh_context)
    ts.register_includes(fresh_context)  # twice: harmless
    assert set(shaders.INCLUDABLE) <= set(fresh_context.includes)
    prog = fresh_context.program(vertex_shader=VT_VS, fragment_shader=VT_FS)
    assert "u_vt_cache" in prog
    prog.release()


@pytest.mark.gl
def test_a_streamer_registers_its_contexts_includes(fresh_context: moderngl.Context) -> None:
    with ts.Streamer(fresh_context):
        prog = fresh_context.program(vertex_shader=VT_VS, fragment_shader=VT_FS)
        prog.release()


@pytest.mark.gl
@pytest.mark.parametrize("use", ["VT_DECLARE(u_vt)", "vec4 c = VT_SAMPLE(u_vt, vec2(0.5));"])
def test_vt_names_without_the_include_say_which_include(gl_context: moderngl.Context, use: str) -> None:
    fs = f"#version 450 core\nout vec4 f_color;\n{use}\nvoid main() {{ f_color = vec4(1.0); }}\n"
    with pytest.raises(ShaderCompileError) as info:
        ts.program(gl_context, vertex_shader=VT_VS, fragment_shader=fs)
    message = str(info.value)
    assert message.startswith("fragment shader uses VT_")
    assert "<fragment>:3" in message and 'add #include "texstream/vt.glsl"' in message
    assert info.value.stage == "fragment"


MGLW_PROGRAM = """#version 450 core
#if defined VERTEX_SHADER
#include "texstream/common.glsl"
out vec2 v_uv;
void main() { v_uv = ts_fullscreen_uv(gl_VertexID); gl_Position = ts_fullscreen_position(gl_VertexID); }
#elif defined FRAGMENT_SHADER
#include "texstream/vt.glsl"
VT_DECLARE(u_vt)
in vec2 v_uv;
out vec4 f_color;
void main() { f_color = VT_SAMPLE(u_vt, v_uv); }
#endif
"""


@pytest.mark.gl
def test_moderngl_window_load_program_finds_texstream_includes(
    gl_context: moderngl.Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mglw = pytest.importorskip("moderngl_window")
    from moderngl_window import resources
    from moderngl_window.conf import settings
    from moderngl_window.exceptions import ImproperlyConfigured
    from moderngl_window.meta import ProgramDescription

    (tmp_path / "streamed.glsl").write_text(MGLW_PROGRAM)
    monkeypatch.setattr(settings, "PROGRAM_FINDERS", ["moderngl_window.finders.program.FilesystemFinder"])
    monkeypatch.setattr(settings, "PROGRAM_DIRS", [tmp_path])
    mglw.activate_context(ctx=gl_context)
    with pytest.raises(ImproperlyConfigured, match="texstream/common.glsl"):  # moderngl-window alone
        resources.programs.load(ProgramDescription(path="streamed.glsl"))
    ts.register_includes(gl_context)
    prog = resources.programs.load(ProgramDescription(path="streamed.glsl"))
    assert "u_vt_cache" in prog
    prog.release()
