"""The streaming runtime: deciding what is resident apart from moving bytes.

Layout
------
Deciders (plain numpy; no GL object, no thread; tested on the CPU with synthetic feedback):

- ``slots.py``: `SlotLedger`, one per cache pool (allocate, keep free, LRU victims, pins, release,
  shrink plans, invariant checks; slots handed out as runs of consecutive layers), `SlotGeometry`;
  ``victims.py``: `VictimPicker`, a ledger's LRU victims (one pass over the slots, whose next best
  candidates serve later evictions while none of them was used);
  ``pool_sizing.py``: `plan_capacities`, the budget's cache bytes shared between the pools;
- ``residency.py``: `Residency`, the only owner of residency state: the tile id space (``tiles.py``),
  the page tables as arrays (``page_table.py``), the ledgers, the request scheduler
  (``requests.py``), the feedback reduction (``feedback_reduce.py``), the mip-bias steps of the
  budget (``budget.py``) and the latency and totals counters. Verbs: ``observe(feedback)``,
  ``apply(drained=/uploaded=)``, ``orders(free ring slots)``, ``plan(budget)``, ``apply_resize``;
- ``feedback_bursts.py``: `FeedbackBursts`, whether a frame's draws record dense feedback (half the
  stride for a few frames after the wanted pages jump, or after `Streamer.camera_cut()`);
- ``int_sets.py``: sorted sets of small integer arrays (`sorted_unique`, `has_duplicates`,
  `distinct`): sort-based, as numpy 2's ``np.unique`` costs tens of microseconds on a frame's few
  hundred ids;
- ``records.py``: what movers report back (`LoadRecords`, `Drained`, `Uploaded`);
- ``budget_advice.py``: the smallest budget that fits (pinned layers, page tables, feedback and a
  staging ring that grows with the budget), named by `BudgetError`;
- ``upload_budget.py``: `UploadCost` (seconds per upload call and per byte, measured) and
  `within_budget` (which of a frame's upload calls fit ``StreamerConfig.upload_time_budget_ms``);
- ``upload_plan.py``: a frame's upload calls (`upload_runs`: runs of consecutive layers at one cell;
  `PoolUploads`; `keep_within_budget`) and the device path's choice, size and copies
  (`choose_upload_path`, `device_slots`, `copy_spans`);
- ``upload_choice.py``: which READY loads a frame uploads and their calls (`UploadChoice`: one compiled
  call each, ``ts_choose_uploads`` and ``ts_plan_uploads``, with numpy twins);
- ``sharing.py``: which packs are open and the handles on each (a pack opened twice is shared);
- ``texture_sets.py``: texture sets (`SetTable`: a set's lead pages mapped onto its members by mip
  offset, one gather a frame) and priorities (`Priorities`, the priority share of the mip bias).

Movers (the only modules that hold GL objects or threads; they carry out the deciders' orders and
report results as records, and change no residency state of their own accord):

- ``pools.py``: `CachePool`, one GL texture array plus its ledger, carrying out its move plans;
  ``pool_set.py``: which pools exist; ``page_buffer.py``: the page tables' GPU buffer;
- ``staging.py``: the persistent-mapped staging ring (slots handed out in ring order);
  ``device_staging.py``: the device path's device-local buffer (`UploadPath.DEVICE_BUFFER`: a
  frame's runs copied into it, one buffer copy per contiguous ring span, and uploaded from it);
  ``texture_staging.py``: the staging-texture path's arrays (`UploadPath.STAGING_TEXTURE`: a compute
  pass stores a frame's blocks from the ring into RG32UI/RGBA32UI arrays, one block-compatible copy
  per run lands them in the cache);
  ``staging_share.py``: the staging share of the budget and its split between ring and device buffer;
  ``uploader.py``: a load's whole life and the upload calls (one per run of consecutive cache
  layers at one cell, read from consecutive ring slots); ``blocking_load.py``: its blocking path
  (pinned levels at open, all-resident references); ``io_workers.py``: the I/O thread pool;
  ``byte_sources.py``: where a tile's bytes come from (local pread, remote ranges) and how they
  are decoded;
- ``feedback.py``: the feedback buffers, their compaction on the GPU (unique pages with counts,
  shaders/vt_feedback_compact.glsl) and their asynchronous readback; its fences also tell the core
  which frames' draws the GPU has finished (cache slots evicted after them are writable at once);
- ``texture.py``: `VirtualTexture`, the handle a shader binds (given callbacks at construction; it
  does not import the streamer).

The facade: ``streamer.py`` (`Streamer`: the frame script and the public methods) with its read-only
views and hooks in ``views.py``, its texture-set verbs and the `TextureSet` handle in ``sets.py``,
``frame_stats.py`` (`FrameStats`, `StreamerStats`, `IOStatus`, `FeedbackInfo`) and
``residency.Completeness``. Telemetry and the memory report read these views,
never a streamer's private attributes.

Threading contract
------------------
- The render thread (the one that made the streamer, its GL context current) makes every GL call
  and every state change: `update()`, open, close, budget changes, every ledger, table and load
  state change. Calls from another thread raise `EngineError`.
- I/O threads (``io_workers.py``, with ``byte_sources.py`` on them) read, checksum and decompress a
  batch of tiles into ring memory handed to them; they touch no GL and no engine state and send
  back one message per batch. Remote packs add their own network threads (``texstream.remote``).
- Only the movers listed above may import ``moderngl``, ``texstream.gl`` or ``threading``; the
  deciders and what they import may not (tests/runtime/test_layout.py checks it).

One frame (`Streamer.update`; `FrameStats` times each phase: ``feedback_ms`` ... ``stats_ms``)::

    reclaim -> collect feedback -> observe -> apply drains -> upload -> submit orders
            -> upload page tables -> begin the next feedback frame (dense after a jump)
"""
