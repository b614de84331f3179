"""Telemetry: per-frame records, rolling histories, JSONL export and run summaries (`Telemetry`), the
engine's GPU memory table (`memory_summary`), and the HUD drawn over any frame (`Overlay`).

The record formats are documented field by field in docs/TELEMETRY.md (`FRAME_SCHEMA`,
`SUMMARY_SCHEMA`).
"""

from __future__ import annotations

from .font import GlyphAtlas, load_font
from .memory import memory_stats, memory_summary
from .overlay import Overlay
from .schema import FRAME_SCHEMA, SUMMARY_SCHEMA, FrameRecord, schema_markdown, validate_frame, validate_summary
from .stats import HISTORY_SERIES, History, Telemetry

__all__ = [
    "FrameRecord",
    "FRAME_SCHEMA",
    "HISTORY_SERIES",
    "SUMMARY_SCHEMA",
    "GlyphAtlas",
    "History",
    "Overlay",
    "Telemetry",
    "load_font",
    "memory_stats",
    "memory_summary",
    "schema_markdown",
    "validate_frame",
    "validate_summary",
]
