"""Imported by the fork server that starts bake workers (`workers.start_context`): the pipeline and
the tables every worker uses are loaded and built once there, and each forked worker inherits them."""

from __future__ import annotations

from .bands import warm_worker_tables
from .workers import forget_start_environment, install_error_report_hook

forget_start_environment()  # the server started with PYTHONSAFEPATH; its workers need it no more
install_error_report_hook()
warm_worker_tables()
