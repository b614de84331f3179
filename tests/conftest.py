"""The suite's GL context and GL error checks come from texstream's own pytest plugin
(`texstream.testing.plugin`): the ``gl_context`` fixture (one headless EGL context per session) and,
for every test using it, GL_NO_ERROR before and after the test, so a test that leaves an error behind
fails itself instead of a later one. Mark GL tests with ``@pytest.mark.gl``.

Without a GL context or the compiled helper, the tests that need them skip, so `make test` passes
on any machine; ``TEXSTREAM_REQUIRE=gl,native`` (what `.ci/run` sets, with nginx, cluster, docs and
demos) turns those skips into failures, so CI cannot pass by silently testing less.
"""
