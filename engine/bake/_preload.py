"""Imported by the fork server that starts bake workers (`workers.start_context`): the pipeline and
the tables every worker uses are loaded and built once there, and each forked worker inherits them."""

from __future__ import annotations

from .bands import warm_worker_tables

warm_worker_tables()
