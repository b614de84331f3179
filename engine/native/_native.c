/* texstream's compiled helper: the per-tile loops of the streaming core and the bake, in C.
 *
 *   ts_read_batch   (I/O threads) read a batch of tiles from a pack into staging-ring slots:
 *                   coalesced pread of file-contiguous runs, zstd/lz4 decode straight into the
 *                   slot, xxh3-64 check. Called through ctypes.CDLL, so the GIL is released for
 *                   the whole batch (one GIL round trip per batch instead of several per tile).
 *   ts_pool_*       I/O threads with no Python on them, running ts_read_batch on the batches the
 *                   render thread submits and drains (one call a frame each).
 *   ts_checksum_tiles (bake workers) the xxh3-64 of each tile of a band's raw tiles, in one call.
 *   ts_decode_batch (I/O threads) the decode + check half alone, for tiles already in memory (remote
 *                   packs: `RemoteFile` fetched them).
 *   ts_upload_cells (render thread) one glCompressedTexSubImage3D / glTexSubImage3D per tile from
 *                   the bound pixel-unpack buffer; ts_upload_runs one per run of consecutive layers
 *                   (ts_upload_runs_bound: with the checks, bindings and unpack modes around it);
 *                   ts_copy_spans one glCopyBufferSubData per span (staging ring -> device buffer).
 *                   Called through ctypes.PyDLL: it keeps the GIL,
 *                   since only the render thread calls GL and the loop takes microseconds.
 *   ts_choose_uploads, ts_plan_uploads (render thread) which READY loads a frame uploads, and their
 *                   calls (runs of consecutive cache layers per pool): the twins of
 *                   runtime/upload_choice.py's numpy functions, same results.
 *   ts_mip_reduce_rgba8 (bake workers) a band's first mip reduction from 8-bit texels, in one pass (the twin
 *   ts_mip_reduce_f32   of mips.Transfer.reduce's numpy path, bit for bit), and the later ones from float32.
 *   ts_hdr_scanlines (HDR reader) a Radiance picture's scanlines, run-length encoded or flat, into RGBE
 *                   bytes; the twin of assets/hdr.py's `_scanline`, same results and errors.
 *   ts_rgbe_to_float (HDR reader) RGBE bytes -> float32 RGB through hdr.py's 65536-entry table (the
 *                   twin of its numpy path, bit for bit: the same table lookups).
 *   ts_mip_encode_f32   (bake workers) float32 linear texels back to 8-bit codes (mips.Transfer.encode's twin).
 *   ts_mip_reduce_twice_rgba8 (bake workers) a band's first two reductions in one pass: the middle level as
 *                   8-bit codes, the next as float32 (the three loops above, fused).
 *   ts_lattice_noise, ts_subdivide_add, ts_height_rows (bake workers) the procedural terrain and normal
 *                   map generators' loops (bake/procedural.py's numpy path, bit for bit).
 *
 * No library is linked: the decoders and the hash are the C functions the zstandard, lz4 and
 * xxhash Python packages already carry, passed in as function pointers (engine/native/__init__.py
 * finds them). The pure-Python twin of ts_read_batch is engine/runtime/io_workers.py's
 * `_read_batch_python`; both must give the same status codes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Per-tile status (keep in sync with io_workers.ReadStatus). */
enum { TS_OK = 0, TS_SKIPPED = 1, TS_IO_ERROR = 2, TS_TRUNCATED = 3, TS_DECODE_ERROR = 4, TS_CHECKSUM = 5 };
/* Codecs (pack format Supercompression values). */
enum { TS_NONE = 0, TS_ZSTD = 1, TS_LZ4 = 2 };

typedef size_t (*zstd_decompress_fn)(void *dctx, void *dst, size_t cap, const void *src, size_t size);
typedef unsigned (*zstd_is_error_fn)(size_t code);
typedef unsigned long long (*zstd_content_size_fn)(const void *src, size_t size);
typedef int (*lz4_decompress_fn)(const char *src, char *dst, int size, int cap);
typedef uint64_t (*xxh3_fn)(const void *data, size_t len);

typedef struct {
    zstd_decompress_fn zstd_decompress; /* ZSTD_decompressDCtx */
    zstd_is_error_fn zstd_is_error;     /* ZSTD_isError */
    zstd_content_size_fn zstd_content;  /* ZSTD_getFrameContentSize */
    lz4_decompress_fn lz4_decompress;   /* LZ4_decompress_safe */
    xxh3_fn xxh3;                       /* XXH3_64bits */
} ts_codecs;

/* pread exactly `len` bytes unless the file ends; returns bytes read or -errno. */
static int64_t read_fully(int fd, uint8_t *dst, int64_t len, int64_t offset) {
    int64_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, dst + done, (size_t)(len - done), (off_t)(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return -(int64_t)errno;
        }
        if (n == 0) break;
        done += n;
    }
    return done;
}

/* Decode one tile's stored bytes into `dst` (`raw` bytes) and check its xxh3: a TS_* status. */
static int32_t decode_tile(int codec, const uint8_t *src, int64_t stored, uint8_t *dst, int64_t raw, uint64_t checksum,
                           void *zstd_dctx, const ts_codecs *codecs) {
    if (codec == TS_NONE) {
        if (stored != raw) return TS_DECODE_ERROR;
        memcpy(dst, src, (size_t)raw);
    } else if (codec == TS_ZSTD) {
        unsigned long long declared = codecs->zstd_content(src, (size_t)stored);
        if (declared != (unsigned long long)raw) return TS_DECODE_ERROR;
        size_t r = codecs->zstd_decompress(zstd_dctx, dst, (size_t)raw, src, (size_t)stored);
        if (codecs->zstd_is_error(r) || r != (size_t)raw) return TS_DECODE_ERROR;
    } else if (codec == TS_LZ4) {
        int r = codecs->lz4_decompress((const char *)src, (char *)dst, (int)stored, (int)raw);
        if (r != (int)raw) return TS_DECODE_ERROR;
    } else {
        return TS_DECODE_ERROR;
    }
    return codecs->xxh3(dst, (size_t)raw) == checksum ? TS_OK : TS_CHECKSUM;
}

/* Decode `n` tiles whose stored bytes are already in memory (tile i at `src + where[i]`, as fetched
 * for a remote pack) into their ring slots and check them. Only tiles whose status is TS_OK are
 * touched; their status becomes the outcome. Returns tiles decoded. */
int64_t ts_decode_batch(int codec, int64_t n, const uint8_t *src, const int64_t *where, const int64_t *stored,
                        int64_t raw, const uint64_t *checksum, const int64_t *ring_slot, uint8_t *ring,
                        int64_t ring_stride, void *zstd_dctx, const ts_codecs *codecs, int32_t *status) {
    int64_t good = 0;
    for (int64_t i = 0; i < n; i++) {
        if (status[i] != TS_OK) continue;
        status[i] = decode_tile(codec, src + where[i], stored[i], ring + ring_slot[i] * ring_stride, raw, checksum[i],
                                zstd_dctx, codecs);
        good += status[i] == TS_OK;
    }
    return good;
}

/* (bake workers) The xxh3-64 of each of `n` tiles of `size` bytes laid back to back at `data` (a band's
 * raw tiles, as the pack's index records them), in one call: `out[i]` for tile i. */
int64_t ts_checksum_tiles(const uint8_t *data, int64_t n, int64_t size, const ts_codecs *codecs, uint64_t *out) {
    if (n < 0 || size < 0) return -1;
    for (int64_t i = 0; i < n; i++) out[i] = codecs->xxh3(data + i * size, (size_t)size);
    return 0;
}

/* Read `n` tiles, sorted by file offset, into their ring slots. A tile whose load_state byte equals
 * `skip_state` when its run starts is skipped (a cancelled load). Tiles closer than `max_gap` bytes
 * in the file are read with one pread (the gap is read too) as long as the run fits `scratch`.
 * status[i] gets a TS_* code and errnum[i] the errno of an I/O error. Returns tiles decoded. */
int64_t ts_read_batch(int fd, int codec, int64_t n, const int64_t *file_offset, const int64_t *stored,
                      int64_t raw, const uint64_t *checksum, const int64_t *ring_slot, uint8_t *ring,
                      int64_t ring_stride, const uint8_t *load_state, uint8_t skip_state, uint8_t *scratch,
                      int64_t scratch_size, int64_t max_gap, void *zstd_dctx, const ts_codecs *codecs,
                      int32_t *status, int32_t *errnum) {
    int64_t good = 0;
    int64_t i = 0;
    while (i < n) {
        if (load_state[ring_slot[i]] == skip_state) {
            status[i] = TS_SKIPPED;
            errnum[i] = 0;
            i++;
            continue;
        }
        /* Grow a run [i, j) of tiles read with one pread. */
        int64_t start = file_offset[i];
        int64_t end = start + stored[i];
        int64_t j = i + 1;
        while (j < n && load_state[ring_slot[j]] != skip_state) {
            int64_t next_end = file_offset[j] + stored[j];
            if (file_offset[j] < end || file_offset[j] - end > max_gap || next_end - start > scratch_size) break;
            end = next_end;
            j++;
        }
        int64_t want = end - start;
        uint8_t *buf = scratch;
        if (want > scratch_size) { /* one tile larger than the scratch buffer cannot happen (sized by the caller) */
            for (int64_t k = i; k < j; k++) { status[k] = TS_IO_ERROR; errnum[k] = EOVERFLOW; }
            i = j;
            continue;
        }
        int64_t got = read_fully(fd, buf, want, start);
        for (int64_t k = i; k < j; k++) {
            errnum[k] = 0;
            int64_t rel = file_offset[k] - start;
            uint8_t *dst = ring + ring_slot[k] * ring_stride;
            if (got < 0) { status[k] = TS_IO_ERROR; errnum[k] = (int32_t)(-got); continue; }
            if (rel + stored[k] > got) { status[k] = TS_TRUNCATED; continue; }
            status[k] = decode_tile(codec, buf + rel, stored[k], dst, raw, checksum[k], zstd_dctx, codecs);
            good += status[k] == TS_OK;
        }
        i = j;
    }
    return good;
}

/* ---- ts_pool: I/O threads with no Python on them ------------------------------------------------
 *
 * The render thread hands a frame's read batches over with ts_pool_submit_many (one call, a few
 * microseconds, the GIL kept) and collects finished ones with ts_pool_drain; POSIX threads run ts_read_batch on
 * them and never take the interpreter lock, so nothing they do competes with the render thread's
 * Python. The caller keeps every array named in a job alive (and the ring mapped) until the job comes
 * back through ts_pool_drain (or forever, when ts_pool_close leaves a thread stuck in a read).
 *
 * A read that hangs cannot be interrupted: ts_pool_overdue gives up jobs read for longer than a
 * timeout, retires their threads (each exits once its read returns, its job coming back marked
 * abandoned) and starts replacements. ts_pool_close drops queued jobs and waits a bounded time; a pool
 * closed with threads still inside a read is freed by the last of them. ts_pool_hold is a test hook:
 * the next jobs taken wait before their read until released (reads that hang). */
#include <pthread.h>
#include <time.h>

typedef void *(*zstd_create_fn)(void);
typedef size_t (*zstd_free_fn)(void *dctx);

typedef struct ts_job {
    int64_t id;
    int fd, codec;
    int64_t n, raw, limit; /* limit: the longest single read (>= the largest stored tile) */
    const int64_t *file_offset, *stored, *ring_slot;
    const uint64_t *checksum;
    int32_t *status, *errnum;
    double seconds;
    int abandoned;
    struct ts_job *next;
} ts_job;

struct ts_pool;

typedef struct ts_worker {
    struct ts_pool *pool;
    ts_job *job; /* the job being read, NULL between jobs */
    double started;
    int retired, exited;
    struct ts_worker *next;
} ts_worker;

typedef struct ts_pool {
    pthread_mutex_t lock;
    pthread_cond_t work;   /* a job queued, or closing */
    pthread_cond_t exited; /* a thread exited, or a job finished */
    pthread_cond_t released; /* the test hook's held reads let go */
    ts_job *queued, *queued_tail, *done, *done_tail;
    ts_worker *workers;
    int64_t live; /* threads not yet exited */
    int closing, orphaned;
    int64_t hold_next, hold_round; /* the test hook: reads still to hold, and which release they wait for */
    int64_t queued_count;
    uint8_t *ring;
    int64_t ring_stride, max_gap;
    const uint8_t *load_state;
    uint8_t skip_state;
    ts_codecs codecs;
    zstd_create_fn create_dctx;
    zstd_free_fn free_dctx;
} ts_pool;

static double ts_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Free a list of jobs. */
static void ts_free_jobs(ts_job *j) {
    for (ts_job *next; j; j = next) { next = j->next; free(j); }
}

/* The CLOCK_REALTIME instant `timeout_s` from now, for pthread_cond_timedwait. */
static struct timespec ts_deadline(double timeout_s) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double end = (double)until.tv_sec + 1e-9 * (double)until.tv_nsec + (timeout_s > 0 ? timeout_s : 0);
    until.tv_sec = (time_t)end;
    until.tv_nsec = (long)((end - (double)until.tv_sec) * 1e9);
    return until;
}

static void ts_pool_free_all(ts_pool *p) {
    ts_free_jobs(p->queued);
    ts_free_jobs(p->done);
    for (ts_worker *w = p->workers, *next; w; w = next) { next = w->next; free(w); }
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->exited);
    pthread_cond_destroy(&p->released);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static void ts_fail_job(ts_job *j, int err) {
    for (int64_t k = 0; k < j->n; k++) { j->status[k] = TS_IO_ERROR; j->errnum[k] = err; }
}

static void *ts_worker_main(void *arg) {
    ts_worker *w = (ts_worker *)arg;
    ts_pool *p = w->pool;
#ifdef SCHED_BATCH
    /* A woken reader must not preempt the render thread: on a machine with few cores it would take
     * that thread's core in the middle of update() (a Python thread woken there waits for the lock
     * instead). SCHED_BATCH threads get their CPU share but never preempt on wake-up. */
    struct sched_param batch = {0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch);
#endif
    uint8_t *scratch = NULL;
    int64_t scratch_size = 0;
    void *dctx = p->create_dctx();
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!w->retired && !p->closing && p->queued == NULL) pthread_cond_wait(&p->work, &p->lock);
        if (w->retired || p->closing) break;
        ts_job *j = p->queued;
        p->queued = j->next;
        if (p->queued == NULL) p->queued_tail = NULL;
        p->queued_count--;
        if (p->queued) pthread_cond_signal(&p->work); /* wake the next reader: the render thread woke one */
        j->next = NULL;
        w->job = j;
        w->started = ts_now();
        if (p->hold_next > 0) { /* the test hook: a read that hangs until ts_pool_hold(p, 0) */
            p->hold_next--;
            int64_t round = p->hold_round;
            while (p->hold_round == round) pthread_cond_wait(&p->released, &p->lock);
        }
        pthread_mutex_unlock(&p->lock);
        double t0 = ts_now();
        if (j->limit > scratch_size) {
            free(scratch);
            scratch = (uint8_t *)malloc((size_t)j->limit);
            scratch_size = scratch ? j->limit : 0;
        }
        if (scratch == NULL || (j->codec == TS_ZSTD && dctx == NULL))
            ts_fail_job(j, ENOMEM);
        else
            ts_read_batch(j->fd, j->codec, j->n, j->file_offset, j->stored, j->raw, j->checksum, j->ring_slot, p->ring,
                          p->ring_stride, p->load_state, p->skip_state, scratch, scratch_size, p->max_gap, dctx,
                          &p->codecs, j->status, j->errnum);
        j->seconds = ts_now() - t0;
        pthread_mutex_lock(&p->lock);
        w->job = NULL;
        if (p->done_tail) p->done_tail->next = j; else p->done = j;
        p->done_tail = j;
        pthread_cond_broadcast(&p->exited); /* ts_pool_wait waits on it too */
    }
    /* Once the lock is let go, `p` may be freed by ts_pool_release (unless this is its last thread of
     * an orphaned pool): nothing of it is touched after the unlock but what was copied here. */
    zstd_free_fn free_dctx = p->free_dctx;
    w->exited = 1;
    p->live--;
    int last_out = p->orphaned && p->live == 0;
    pthread_cond_broadcast(&p->exited);
    pthread_mutex_unlock(&p->lock);
    free(scratch);
    if (dctx) free_dctx(dctx);
    if (last_out) ts_pool_free_all(p);
    return NULL;
}

/* Start one more thread (the lock held). 0, or -errno. */
static int ts_spawn(ts_pool *p) {
    ts_worker *w = (ts_worker *)calloc(1, sizeof(ts_worker));
    if (w == NULL) return -ENOMEM;
    w->pool = p;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int err = pthread_create(&thread, &attr, ts_worker_main, w);
    pthread_attr_destroy(&attr);
    if (err) { free(w); return -err; }
    w->next = p->workers;
    p->workers = w;
    p->live++;
    return 0;
}

/* Forget threads that exited (the lock held): nothing touches their records any more. */
static void ts_prune(ts_pool *p) {
    ts_worker **at = &p->workers;
    while (*at) {
        ts_worker *w = *at;
        if (w->exited) { *at = w->next; free(w); } else at = &w->next;
    }
}

/* A pool of `threads` threads reading into `ring` (slot i at ring + i * ring_stride), skipping tiles
 * whose load_state byte equals skip_state. NULL when a thread cannot be started. */
ts_pool *ts_pool_create(int64_t threads, uint8_t *ring, int64_t ring_stride, const uint8_t *load_state,
                        uint8_t skip_state, int64_t max_gap, const ts_codecs *codecs, void *create_dctx,
                        void *free_dctx) {
    if (threads < 1) return NULL;
    ts_pool *p = (ts_pool *)calloc(1, sizeof(ts_pool));
    if (p == NULL) return NULL;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->exited, NULL);
    pthread_cond_init(&p->released, NULL);
    p->ring = ring;
    p->ring_stride = ring_stride;
    p->load_state = load_state;
    p->skip_state = skip_state;
    p->max_gap = max_gap;
    p->codecs = *codecs;
    p->create_dctx = (zstd_create_fn)create_dctx;
    p->free_dctx = (zstd_free_fn)free_dctx;
    pthread_mutex_lock(&p->lock);
    int err = 0;
    for (int64_t i = 0; i < threads && !err; i++) err = ts_spawn(p);
    if (err) { /* stop the ones started; the last one out frees the pool */
        p->closing = 1;
        p->orphaned = 1;
        int none = p->live == 0;
        pthread_cond_broadcast(&p->work);
        pthread_mutex_unlock(&p->lock);
        if (none) ts_pool_free_all(p);
        return NULL;
    }
    pthread_mutex_unlock(&p->lock);
    return p;
}

/* Queue `nb` batches in one call: batch b is job `first_id + b`, its fd, codec, tile count, raw tile
 * size and longest read in meta[5b .. 5b+4]; its tiles are the next meta[5b+2] entries of the
 * concatenated arrays (status and errnum likewise). Returns batches queued (all), -EPIPE once closed,
 * -ENOMEM (none queued then). */
int64_t ts_pool_submit_many(ts_pool *p, int64_t nb, int64_t first_id, const int64_t *meta, const int64_t *file_offset,
                            const int64_t *stored, const uint64_t *checksum, const int64_t *ring_slot, int32_t *status,
                            int32_t *errnum) {
    ts_job *head = NULL, *tail = NULL;
    int64_t at = 0;
    for (int64_t b = 0; b < nb; b++) {
        ts_job *j = (ts_job *)calloc(1, sizeof(ts_job));
        if (j == NULL) {
            ts_free_jobs(head);
            return -ENOMEM;
        }
        const int64_t *m = meta + 5 * b;
        j->id = first_id + b;
        j->fd = (int)m[0];
        j->codec = (int)m[1];
        j->n = m[2];
        j->raw = m[3];
        j->limit = m[4];
        j->file_offset = file_offset + at;
        j->stored = stored + at;
        j->checksum = checksum + at;
        j->ring_slot = ring_slot + at;
        j->status = status + at;
        j->errnum = errnum + at;
        at += m[2];
        if (tail) tail->next = j; else head = j;
        tail = j;
    }
    if (head == NULL) return 0;
    pthread_mutex_lock(&p->lock);
    if (p->closing) {
        pthread_mutex_unlock(&p->lock);
        ts_free_jobs(head);
        return -EPIPE;
    }
    if (p->queued_tail) p->queued_tail->next = head; else p->queued = head;
    p->queued_tail = tail;
    p->queued_count += nb;
    /* One wake-up on this (the render) thread, whatever nb: each reader that takes a job wakes the
     * next while jobs are left (held readers wait on `released`, not here). */
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->lock);
    return nb;
}

/* Finished jobs, oldest first, at most `cap`: their ids, read seconds and abandoned flags. A count. */
int64_t ts_pool_drain(ts_pool *p, int64_t cap, int64_t *ids, double *seconds, uint8_t *abandoned) {
    int64_t k = 0;
    pthread_mutex_lock(&p->lock);
    while (k < cap && p->done) {
        ts_job *j = p->done;
        p->done = j->next;
        if (p->done == NULL) p->done_tail = NULL;
        ids[k] = j->id;
        seconds[k] = j->seconds;
        abandoned[k] = (uint8_t)j->abandoned;
        k++;
        free(j);
    }
    pthread_mutex_unlock(&p->lock);
    return k;
}

/* Block until a job is finished or `timeout_s` passed (called without the GIL). 1 when one is. */
int64_t ts_pool_wait(ts_pool *p, double timeout_s) {
    struct timespec until = ts_deadline(timeout_s);
    pthread_mutex_lock(&p->lock);
    int err = 0;
    while (p->done == NULL && err != ETIMEDOUT) err = pthread_cond_timedwait(&p->exited, &p->lock, &until);
    int64_t ready = p->done != NULL;
    pthread_mutex_unlock(&p->lock);
    return ready;
}

/* Give up the jobs read for longer than `timeout_s`: their ids (at most `cap`) go to `ids`, their
 * threads retire and as many new ones start. A count. A replacement that does not start leaves fewer
 * threads taking jobs (ts_pool_counts shows it); the jobs are given up all the same. */
int64_t ts_pool_overdue(ts_pool *p, double timeout_s, int64_t cap, int64_t *ids) {
    double now = ts_now();
    int64_t k = 0;
    pthread_mutex_lock(&p->lock);
    ts_prune(p);
    for (ts_worker *w = p->workers; w && k < cap; w = w->next) {
        if (w->retired || w->job == NULL || w->job->abandoned || now - w->started < timeout_s) continue;
        w->job->abandoned = 1;
        w->retired = 1;
        ids[k++] = w->job->id; /* its thread is inside that read: it sees `retired` once back */
    }
    for (int64_t i = 0; i < k && !p->closing; i++) ts_spawn(p);
    pthread_mutex_unlock(&p->lock);
    return k;
}

/* counts[0]: threads that take new jobs; counts[1]: retired threads still inside a read; counts[2]:
 * jobs queued, not yet taken by a thread. */
void ts_pool_counts(ts_pool *p, int64_t *counts) {
    counts[0] = counts[1] = 0;
    pthread_mutex_lock(&p->lock);
    counts[2] = p->queued_count;
    for (ts_worker *w = p->workers; w; w = w->next) {
        if (w->exited) continue;
        if (!w->retired && !p->closing)
            counts[0]++;
        else if (w->job != NULL)
            counts[1]++;
    }
    pthread_mutex_unlock(&p->lock);
}

/* The test hook: the next `count` jobs taken wait before their read (as reads that hang) until a
 * call with count 0, which releases every held one. */
void ts_pool_hold(ts_pool *p, int64_t count) {
    pthread_mutex_lock(&p->lock);
    if (count > 0) {
        p->hold_next = count;
    } else {
        p->hold_next = 0;
        p->hold_round++;
        pthread_cond_broadcast(&p->released);
    }
    pthread_mutex_unlock(&p->lock);
}

/* Stop taking jobs: queued ones are dropped (their ids, at most `cap`, to `dropped`; *n_dropped gets
 * the count), and the threads get `timeout_s` to finish the reads in progress (called without the
 * GIL). Returns the threads still inside a read; finished jobs stay for ts_pool_drain until
 * ts_pool_release. */
int64_t ts_pool_close(ts_pool *p, double timeout_s, int64_t cap, int64_t *dropped, int64_t *n_dropped) {
    pthread_mutex_lock(&p->lock);
    int64_t k = 0;
    if (!p->closing) {
        p->closing = 1;
        for (ts_job *j = p->queued; j && k < cap; j = j->next) dropped[k++] = j->id;
        ts_free_jobs(p->queued);
        p->queued = p->queued_tail = NULL;
        p->queued_count = 0;
        pthread_cond_broadcast(&p->work);
    }
    *n_dropped = k;
    struct timespec until = ts_deadline(timeout_s);
    int err = 0;
    while (p->live > 0 && err != ETIMEDOUT) err = pthread_cond_timedwait(&p->exited, &p->lock, &until);
    int64_t live = p->live;
    pthread_mutex_unlock(&p->lock);
    return live;
}

/* Free a closed pool: now if no thread is left, else by the last thread out (its read returned). */
void ts_pool_release(ts_pool *p) {
    pthread_mutex_lock(&p->lock);
    p->closing = 1;
    pthread_cond_broadcast(&p->work);
    int none = p->live == 0;
    if (!none) p->orphaned = 1;
    pthread_mutex_unlock(&p->lock);
    if (none) ts_pool_free_all(p);
}

typedef void (*gl_compressed_sub3d_fn)(unsigned target, int level, int x, int y, int z, int w, int h, int d,
                                       unsigned format, int size, const void *data);
typedef void (*gl_sub3d_fn)(unsigned target, int level, int x, int y, int z, int w, int h, int d, unsigned format,
                            unsigned type, const void *data);

/* One sub-image upload per cell from the bound GL_PIXEL_UNPACK_BUFFER (data = byte offsets). */
void ts_upload_cells(void *compressed_fn, void *plain_fn, int compressed, int64_t n, const int64_t *layer,
                     const int64_t *x, const int64_t *y, int cell, unsigned internal_format, int nbytes,
                     const int64_t *offset) {
    const unsigned GL_TEXTURE_2D_ARRAY = 0x8C1A, GL_RGBA = 0x1908, GL_UNSIGNED_BYTE = 0x1401;
    if (compressed) {
        gl_compressed_sub3d_fn f = (gl_compressed_sub3d_fn)compressed_fn;
        for (int64_t i = 0; i < n; i++)
            f(GL_TEXTURE_2D_ARRAY, 0, (int)x[i], (int)y[i], (int)layer[i], cell, cell, 1, internal_format, nbytes,
              (const void *)(intptr_t)offset[i]);
    } else {
        gl_sub3d_fn f = (gl_sub3d_fn)plain_fn;
        for (int64_t i = 0; i < n; i++)
            f(GL_TEXTURE_2D_ARRAY, 0, (int)x[i], (int)y[i], (int)layer[i], cell, cell, 1, GL_RGBA, GL_UNSIGNED_BYTE,
              (const void *)(intptr_t)offset[i]);
    }
}

/* One sub-image upload per run of depth[i] consecutive layers at one cell from the bound
 * GL_PIXEL_UNPACK_BUFFER (data = byte offset of the run's first layer; the caller set the unpack
 * image height when layers are padded apart). nbytes: one layer's bytes. */
void ts_upload_runs(void *compressed_fn, void *plain_fn, int compressed, int64_t n, const int64_t *layer,
                    const int64_t *x, const int64_t *y, const int64_t *depth, int cell, unsigned internal_format,
                    int nbytes, const int64_t *offset) {
    const unsigned GL_TEXTURE_2D_ARRAY = 0x8C1A, GL_RGBA = 0x1908, GL_UNSIGNED_BYTE = 0x1401;
    if (compressed) {
        gl_compressed_sub3d_fn f = (gl_compressed_sub3d_fn)compressed_fn;
        for (int64_t i = 0; i < n; i++)
            f(GL_TEXTURE_2D_ARRAY, 0, (int)x[i], (int)y[i], (int)layer[i], cell, cell, (int)depth[i], internal_format,
              (int)(nbytes * depth[i]), (const void *)(intptr_t)offset[i]);
    } else {
        gl_sub3d_fn f = (gl_sub3d_fn)plain_fn;
        for (int64_t i = 0; i < n; i++)
            f(GL_TEXTURE_2D_ARRAY, 0, (int)x[i], (int)y[i], (int)layer[i], cell, cell, (int)depth[i], GL_RGBA,
              GL_UNSIGNED_BYTE, (const void *)(intptr_t)offset[i]);
    }
}

typedef void (*gl_enum_fn)(unsigned);
typedef void (*gl_enum_name_fn)(unsigned, unsigned);
typedef void (*gl_enum_int_fn)(unsigned, int);

/* ts_upload_runs with the GL state around it (GLExt.upload_runs' compiled path, the same calls as its
 * Python path): `fns` holds the addresses of glActiveTexture, glBindTexture, glBindBuffer,
 * glPixelStorei, glCompressedTexSubImage3D and glTexSubImage3D. Every run is checked first: its
 * layers inside 0..tex_layers-1 and at least one, its cell inside the tex_size square. Then the
 * texture is bound on texture unit `unit` (a GL_TEXTURE0 + n value), `pbo` as the pixel-unpack
 * buffer, and where a run has more than one layer and pixel_mode > 0 the unpack modes step over the
 * slack between layers (1: GL_UNPACK_IMAGE_HEIGHT rows; 2: image_height texel rows of 4x4 blocks of
 * block_bytes through the compressed block modes); after the calls every mode set goes back to 0
 * and both bindings to 0 (the unit stays active). Returns the layers uploaded, or before any GL call
 * -1 (a run's layers outside the texture), -2 (a cell outside the layer) or -3 (runs of several
 * layers whose slack the modes cannot step over: pixel_mode < 0). */
int64_t ts_upload_runs_bound(const int64_t *fns, unsigned unit, unsigned texture, unsigned pbo, int pixel_mode,
                             int block_bytes, int image_height, int compressed, unsigned internal_format, int cell,
                             int nbytes, int64_t tex_layers, int64_t tex_size, int64_t n, const int64_t *layer,
                             const int64_t *x, const int64_t *y, const int64_t *depth, const int64_t *offset) {
    const unsigned GL_TEXTURE_2D_ARRAY = 0x8C1A, GL_PIXEL_UNPACK_BUFFER = 0x88EC, GL_UNPACK_IMAGE_HEIGHT = 0x806E;
    const unsigned block_modes[4] = {0x9127, 0x9128, 0x9129, 0x912A}; /* GL_UNPACK_COMPRESSED_BLOCK_ W, H, D, SIZE */
    int64_t layers = 0, multi = 0;
    for (int64_t i = 0; i < n; i++) {
        if (depth[i] < 1 || layer[i] < 0 || layer[i] + depth[i] > tex_layers) return -1;
        if (x[i] < 0 || y[i] < 0 || x[i] > tex_size - cell || y[i] > tex_size - cell) return -2;
        layers += depth[i];
        multi |= depth[i] > 1;
    }
    if (multi && pixel_mode < 0) return -3;
    int mode = multi ? pixel_mode : 0;
    gl_enum_fn active_texture = (gl_enum_fn)(intptr_t)fns[0];
    gl_enum_name_fn bind_texture = (gl_enum_name_fn)(intptr_t)fns[1], bind_buffer = (gl_enum_name_fn)(intptr_t)fns[2];
    gl_enum_int_fn pixel_store = (gl_enum_int_fn)(intptr_t)fns[3];
    active_texture(unit);
    bind_texture(GL_TEXTURE_2D_ARRAY, texture);
    bind_buffer(GL_PIXEL_UNPACK_BUFFER, pbo);
    if (mode == 2) {
        const int values[4] = {4, 4, 1, block_bytes};
        for (int k = 0; k < 4; k++) pixel_store(block_modes[k], values[k]);
    }
    if (mode > 0) pixel_store(GL_UNPACK_IMAGE_HEIGHT, image_height);
    ts_upload_runs((void *)(intptr_t)fns[4], (void *)(intptr_t)fns[5], compressed, n, layer, x, y, depth, cell,
                   internal_format, nbytes, offset);
    if (mode > 0) pixel_store(GL_UNPACK_IMAGE_HEIGHT, 0);
    if (mode == 2)
        for (int k = 0; k < 4; k++) pixel_store(block_modes[k], 0);
    bind_buffer(GL_PIXEL_UNPACK_BUFFER, 0);
    active_texture(unit);
    bind_texture(GL_TEXTURE_2D_ARRAY, 0);
    return layers;
}

/* One glCopyBufferSubData per span from the bound GL_COPY_READ_BUFFER to the bound
 * GL_COPY_WRITE_BUFFER: size[i] bytes from src_offset[i] to dst_offset[i]. */
typedef void (*gl_copy_buffer_fn)(unsigned, unsigned, intptr_t, intptr_t, intptr_t);

void ts_copy_spans(void *copy_fn, int64_t n, const int64_t *src_offset, const int64_t *dst_offset,
                   const int64_t *size) {
    const unsigned GL_COPY_READ_BUFFER = 0x8F36, GL_COPY_WRITE_BUFFER = 0x8F37;
    gl_copy_buffer_fn f = (gl_copy_buffer_fn)copy_fn;
    for (int64_t i = 0; i < n; i++)
        f(GL_COPY_READ_BUFFER, GL_COPY_WRITE_BUFFER, (intptr_t)src_offset[i], (intptr_t)dst_offset[i],
          (intptr_t)size[i]);
}

/* ---- a frame's uploads: which loads go, and in which calls (runtime/upload_choice.py) ------------ */

/* Order of two (key, value) pairs: by key, then by value (a stable order for distinct values). */
typedef struct {
    int64_t key, value;
} ts_keyed;

static int ts_keyed_cmp(const void *a, const void *b) {
    const ts_keyed *x = (const ts_keyed *)a, *y = (const ts_keyed *)b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->value > y->value) - (x->value < y->value);
}

/* The loads a frame uploads, in submission order (upload_choice.choose_numpy's twin): the ring slots
 * whose state is `ready`, sorted by seq (then slot), keeping those whose cache slot is writable
 * (writable_at[p][cache_slot] <= frame for a pool p with a table: `tables[p]` an int64 array address
 * of `capacity[p]` entries, or 0: every slot writable), then the first max_tiles of them while the
 * running byte total stays <= max_bytes (the first always, if max_tiles >= 1). `order` is scratch of
 * n_ring pairs. Writes the chosen ring slots to `out`; returns their count, or -1 for a pool or
 * cache slot outside the tables. */
int64_t ts_choose_uploads(int64_t n_ring, const uint8_t *state, int64_t ready, const int64_t *seq,
                          const int64_t *pool, const int64_t *cache_slot, const int64_t *nbytes, int64_t n_pools,
                          const int64_t *tables, const int64_t *capacity, int64_t frame, int64_t max_tiles,
                          int64_t max_bytes, ts_keyed *order, int64_t *out) {
    int64_t n = 0;
    for (int64_t i = 0; i < n_ring; i++)
        if (state[i] == (uint8_t)ready) {
            order[n].key = seq[i];
            order[n].value = i;
            n++;
        }
    if (n > 1) qsort(order, (size_t)n, sizeof(ts_keyed), ts_keyed_cmp);
    int64_t taken = 0, total = 0;
    for (int64_t k = 0; k < n && taken < max_tiles; k++) {
        int64_t i = order[k].value, p = pool[i], c = cache_slot[i];
        if (p < 0 || p >= n_pools) return -1;
        if (tables[p]) {
            if (c < 0 || c >= capacity[p]) return -1;
            if (((const int64_t *)(intptr_t)tables[p])[c] > frame) continue;
        }
        total += nbytes[i];
        if (taken > 0 && total > max_bytes) break;
        out[taken++] = i;
    }
    return taken;
}

/* The upload calls of chosen loads (upload_choice.plan_numpy's twin): the loads sorted by pool, then
 * cache slot, into `ordered`; per pool (a group), maximal runs of loads at consecutive cache slots of
 * one cell (a run ends where slot % layers[p] == 0) read from consecutive ring slots, at most
 * max_run[p] long (0: no bound). Runs are (start, count) pairs in `runs`, each start counted from its
 * group's first load; `groups` gets five values a pool: pool, first load, loads, first run, runs.
 * `order` is scratch of n pairs. Returns the number of groups, or -1 for a pool outside 0..n_pools-1,
 * a pool with no layers or a cache slot outside 0..2^28-1 (what page-table entries address). */
int64_t ts_plan_uploads(int64_t n, const int64_t *chosen, const int64_t *pool, const int64_t *cache_slot,
                        int64_t n_pools, const int64_t *layers, const int64_t *max_run, ts_keyed *order,
                        int64_t *ordered, int64_t *runs, int64_t *groups) {
    /* one key a load, pool then cache slot (slots fit 28 bits), carrying its ring slot: one qsort */
    for (int64_t k = 0; k < n; k++) {
        int64_t i = chosen[k], p = pool[i], c = cache_slot[i];
        if (p < 0 || p >= n_pools || layers[p] < 1 || c < 0 || c >= ((int64_t)1 << 28)) return -1;
        order[k].key = p << 28 | c;
        order[k].value = i;
    }
    if (n > 1) qsort(order, (size_t)n, sizeof(ts_keyed), ts_keyed_cmp);
    for (int64_t k = 0; k < n; k++) ordered[k] = order[k].value;
    int64_t n_groups = 0, n_runs = 0;
    for (int64_t k = 0; k < n;) {
        int64_t p = order[k].key >> 28, first = k, first_run = n_runs;
        int64_t L = layers[p], cap = max_run[p] > 0 ? max_run[p] : INT64_MAX;
        while (k < n && order[k].key >> 28 == p) {
            int64_t start = k, count = 1;
            k++;
            /* the next load continues the run: the next cache slot of this pool (keys one apart, in
             * the same cell) and the next ring slot */
            while (k < n && count < cap && order[k].key == order[k - 1].key + 1 &&
                   ordered[k] == ordered[k - 1] + 1 && (order[k].key & (((int64_t)1 << 28) - 1)) % L != 0) {
                count++;
                k++;
            }
            runs[2 * n_runs] = start - first;
            runs[2 * n_runs + 1] = count;
            n_runs++;
        }
        int64_t *g = groups + 5 * n_groups++;
        g[0] = p;
        g[1] = first;
        g[2] = k - first;
        g[3] = first_run;
        g[4] = n_runs - first_run;
    }
    return n_groups;
}

/* Mark `id` in `bits` and widen [*lo, *hi] to it: the companion of ts_take_marked. */
static inline void ts_mark(uint64_t *bits, int64_t id, int64_t *lo, int64_t *hi) {
    bits[id >> 6] |= (uint64_t)1 << (id & 63);
    *lo = id < *lo ? id : *lo;
    *hi = id > *hi ? id : *hi;
}

/* The ids marked in `bits` between `lo` and `hi` (both inclusive; none when hi < 0), ascending, with
 * their counts in `scratch`, written to out_ids / out_counts; clears both marks and counts. Returns
 * how many were written. (ts_feedback_pages collects through it.) */
static int64_t ts_take_marked(uint64_t *bits, int64_t *scratch, int64_t lo, int64_t hi, int64_t *out_ids,
                              int64_t *out_counts) {
    int64_t m = 0;
    for (int64_t w = lo >> 6; hi >= 0 && w <= hi >> 6; w++) {
        uint64_t word = bits[w];
        bits[w] = 0;
        while (word) {
            const int64_t id = (w << 6) + __builtin_ctzll(word);
            word &= word - 1;
            out_ids[m] = id;
            out_counts[m] = scratch[id];
            scratch[id] = 0;
            m++;
        }
    }
    return m;
}

/* A new view's wanted pages with the eight same-level neighbours of each (RequestScheduler.widened's
 * twin): ids[0..n) ascending and unique, counts theirs; a page that names a tile (level[id] >= 0) adds
 * the neighbours inside its level's grid (tiles_x x tiles_y tiles from level_first, per texture and
 * level, max_levels a row). The pages keep their counts, new neighbours get 1; written ascending to
 * out_ids / out_counts (room for 9n). `scratch` (capacity counts) and `bits` (capacity bits) must be
 * zero and are left zero. Returns how many were written, or -1 for a page outside 0..capacity-1 or a
 * tile whose texture, level or place is outside the grids (nothing written, scratch and bits left zero). */
int64_t ts_widen_pages(int64_t n, const int64_t *ids, const int64_t *counts, int64_t capacity, const int16_t *tex,
                       const int8_t *level, const int64_t *level_first, const int64_t *tiles_x, const int64_t *tiles_y,
                       int64_t n_textures, int64_t max_levels, int64_t *scratch, uint64_t *bits, int64_t *out_ids,
                       int64_t *out_counts) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = ids[i];
        if (id < 0 || id >= capacity) return -1;
        if (level[id] < 0) continue;
        if (tex[id] < 0 || tex[id] >= n_textures || level[id] >= max_levels) return -1;
        const int64_t g = (int64_t)tex[id] * max_levels + level[id];
        if (tiles_x[g] < 1 || tiles_y[g] < 1 || id < level_first[g] || id - level_first[g] >= tiles_x[g] * tiles_y[g])
            return -1;
    }
    int64_t lo = capacity, hi = -1;
    for (int64_t i = 0; i < n; i++) {
        ts_mark(bits, ids[i], &lo, &hi);
        scratch[ids[i]] = counts[i];
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = ids[i];
        if (level[id] < 0) continue; /* a page of no tile has no grid */
        const int64_t g = (int64_t)tex[id] * max_levels + level[id];
        const int64_t tx = tiles_x[g], ty = tiles_y[g], off = id - level_first[g];
        const int64_t x = off % tx, y = off / tx;
        for (int64_t dy = -1; dy <= 1; dy++)
            for (int64_t dx = -1; dx <= 1; dx++) {
                if ((dx == 0 && dy == 0) || x + dx < 0 || x + dx >= tx || y + dy < 0 || y + dy >= ty) continue;
                const int64_t nb = id + dx + dy * tx;
                if (!(bits[nb >> 6] >> (nb & 63) & 1)) {
                    ts_mark(bits, nb, &lo, &hi);
                    scratch[nb] = 1;
                }
            }
    }
    return ts_take_marked(bits, scratch, lo, hi, out_ids, out_counts);
}

/* Of the pages ids[0..m), how many each group holds (see ts_feedback_pages) into group_pages, when
 * it is not NULL; returns m. */
static int64_t ts_count_groups(int64_t m, const int64_t *ids, const int16_t *tex, const int64_t *group_of,
                               int64_t n_tex, int64_t n_groups, int64_t *group_pages) {
    if (group_pages == NULL)
        return m;
    for (int64_t g = 0; g < n_groups; g++)
        group_pages[g] = 0;
    for (int64_t i = 0; i < m; i++) {
        const int64_t t = tex[ids[i]];
        if (t < 0 || t >= n_tex)
            continue;
        const int64_t g = group_of[t];
        if (g >= 0 && g < n_groups)
            group_pages[g]++;
    }
    return m;
}

/* (Render thread) A frame's feedback to its wanted pages in one call: the entries counted per id,
 * each id checked to name a tile, and the texture sets' expansion after it. Entries values[0..n) are
 * tile ids in any order, each weighing weights[i] (a GPU-compacted buffer's counts) or 1 when
 * `weights` is NULL (raw entries). Entries at or above n_ids add their weight to stats[0] and are dropped; distinct ids whose
 * level[id] < 0 (header entries, a closed texture's ids) add their summed weight to stats[1] and are
 * dropped. Every remaining page then also adds its coverage to the non-negative entries of its row of
 * `follow` (capacity x k, texture_sets.SetTable's; k = 0: no sets). Writes the sorted distinct pages
 * with summed coverage to out_ids / out_counts (room for min(n, n_ids) * (k + 1) entries) and returns
 * how many; -1 when n_ids is outside [0, capacity], k < 0 or a follow entry is at or above capacity
 * (outputs undefined).
 * When `group_pages` is not NULL it receives, per group (a cache pool: group_of[t] for texture t of
 * n_tex; entries outside 0..n_groups-1 count nowhere), how many of the written pages are its.
 * `level` and `tex` hold `capacity` entries (the tile space's per-id arrays).
 * `scratch` (capacity int64s) and `bits` (capacity / 64 rounded up words) are zero on entry and zero
 * again on return, refused or not. Linear in n plus the distinct pages times k + 1 plus the words
 * between the smallest and the largest id. */
int64_t ts_feedback_pages(int64_t n, const uint32_t *values, const uint32_t *weights, int64_t n_ids,
                          const int8_t *level, const int16_t *tex, const int32_t *follow, int64_t k, int64_t capacity,
                          const int64_t *group_of, int64_t n_tex, int64_t n_groups, int64_t *group_pages,
                          int64_t *scratch, uint64_t *bits, int64_t *out_ids, int64_t *out_counts, int64_t *stats) {
    if (n_ids > capacity || n_ids < 0 || k < 0)
        return -1;
    int64_t lo = n_ids, hi = -1, outside = 0, invalid = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t v = values[i];
        const int64_t w = weights ? (int64_t)weights[i] : 1;
        if (v >= n_ids) {
            outside += w;
            continue;
        }
        if (weights) {
            scratch[v] += w;
            ts_mark(bits, v, &lo, &hi);
        } else if (scratch[v]++ == 0) {
            ts_mark(bits, v, &lo, &hi);
        }
    }
    const int64_t m = ts_take_marked(bits, scratch, lo, hi, out_ids, out_counts);
    int64_t kept = 0;
    for (int64_t i = 0; i < m; i++) {
        const int64_t id = out_ids[i];
        if (level[id] < 0) {
            invalid += out_counts[i];
            continue;
        }
        out_ids[kept] = id;
        out_counts[kept] = out_counts[i];
        kept++;
    }
    stats[0] = outside;
    stats[1] = invalid;
    if (k == 0 || kept == 0)
        return ts_count_groups(kept, out_ids, tex, group_of, n_tex, n_groups, group_pages);
    lo = capacity;
    hi = -1;
    for (int64_t i = 0; i < kept; i++) {
        const int64_t id = out_ids[i], c = out_counts[i];
        const int32_t *row = follow + id * k;
        scratch[id] += c;
        ts_mark(bits, id, &lo, &hi);
        for (int64_t j = 0; j < k; j++) {
            const int64_t page = row[j];
            if (page < 0)
                continue;
            if (page >= capacity) {
                bad = 1;
                continue;
            }
            scratch[page] += c;
            ts_mark(bits, page, &lo, &hi);
        }
    }
    const int64_t total = ts_take_marked(bits, scratch, lo, hi, out_ids, out_counts);
    return bad ? -1 : ts_count_groups(total, out_ids, tex, group_of, n_tex, n_groups, group_pages);
}

/* (Request scheduler, render thread) The missing chains of a frame's wanted pages ids[0..n) (with
 * coverage counts[i]), weighed, as sorted unique tile ids with summed weights (requests.py's numpy
 * `_demand` is the twin). A page is resident when own[id] >= 0 (resident[i] = 1, nothing added);
 * else its chain is itself and its ancestors (parent[]) below its nearest resident ancestor, or up
 * to the texture's coarsest level (level_count[tex[id]] - 1) when none is resident within max_levels
 * steps. Every tile of the chain gets max(counts[i], 1) * gap, gap = the levels from the page up to
 * that ancestor (or to level_count), times priority[tex[id]] rounded up and capped at score_limit
 * when any missing page's texture has a priority other than 1 (else the weight stays exact).
 * Weights are summed in `scratch` (capacity int64s) and presence marked in `bits` (capacity / 64
 * rounded up words): both zero on entry and again on return. `gap` holds 2 n int64s of working
 * space; out_ids / out_weights hold n * max_levels entries. Ids outside [0, capacity), pages of no
 * texture or level, parents past the table and chains longer than max_levels are refused: returns
 * -1 (the scratch is still cleared); else the number of ids written. Linear in n * max_levels plus
 * the words between the smallest and the largest id. */
int64_t ts_missing_chains(int64_t n, const int64_t *ids, const int64_t *counts, const int32_t *parent,
                          const int32_t *own, const int8_t *level, const int16_t *tex, int64_t capacity,
                          const int64_t *level_count, const double *priority, int64_t n_textures,
                          int64_t max_levels, int64_t score_limit, int64_t *scratch, uint64_t *bits, int64_t *gap,
                          uint8_t *resident, int64_t *out_ids, int64_t *out_weights) {
    int64_t lo = capacity, hi = -1, bad = 0, uniform = 1;
    for (int64_t i = 0; i < n; i++) { /* each page's gap and unweighed weight */
        const int64_t id = ids[i];
        gap[i] = 0;
        resident[i] = 0;
        if (id < 0 || id >= capacity || tex[id] < 0 || tex[id] >= n_textures || level[id] < 0) {
            bad = 1;
            continue;
        }
        if (own[id] >= 0) {
            resident[i] = 1;
            continue;
        }
        int64_t cur = id;
        for (int64_t step = 0; cur >= 0 && own[cur] < 0 && step < max_levels; step++) {
            cur = parent[cur];
            if (cur >= capacity) {
                cur = -1;
                bad = 1;
            }
        }
        const int64_t t = tex[id];
        const int64_t ceiling = (cur >= 0 && own[cur] >= 0) ? level[cur] : level_count[t];
        const int64_t g = ceiling - level[id];
        if (g > max_levels) {
            bad = 1;
            continue;
        }
        gap[i] = g > 1 ? g : 1; /* tiles in the chain: the page itself at least */
        gap[n + i] = (counts[i] > 1 ? counts[i] : 1) * g;
        if (priority[t] != 1.0)
            uniform = 0;
    }
    for (int64_t i = 0; i < n; i++) { /* the chains, weighed by priority */
        if (gap[i] == 0)
            continue;
        int64_t w = gap[n + i];
        if (!uniform) {
            const double p = ceil((double)w * priority[tex[ids[i]]]);
            w = (int64_t)(p < (double)score_limit ? p : (double)score_limit);
        }
        int64_t cur = ids[i];
        for (int64_t d = 0; d < gap[i]; d++) {
            if (d > 0)
                cur = parent[cur];
            if (cur < 0 || cur >= capacity) {
                bad = 1;
                break;
            }
            scratch[cur] += w;
            ts_mark(bits, cur, &lo, &hi);
        }
    }
    const int64_t m = ts_take_marked(bits, scratch, lo, hi, out_ids, out_weights);
    return bad ? -1 : m;
}

/* (Request scheduler, render thread) The prefetch candidates of a frame's wanted pages ids[0..n)
 * (coverage counts[i]; resident[i] != 0 for a page that is resident), as sorted unique tile ids with
 * summed weights (requests.py's numpy `_prefetch` is the twin): the 4 neighbours of every page in
 * its level's grid and the up to 4 children of every resident page above level 0, each weighing
 * max(counts[i], 1); then times priority[tex] rounded up and capped at score_limit when any
 * candidate's texture has a priority other than 1; then only the candidates not resident whose
 * parent is. level_first, tiles_x, tiles_y are n_textures x max_levels tables (tiles.TileSpace).
 * Weights go through `scratch` (capacity int64s) and marks through `bits` (capacity / 64 rounded up
 * words), zero on entry and on return; out_ids / out_weights hold 8 n entries. Pages or
 * candidates outside the tables are refused: returns -1 (the scratch is still cleared); else the
 * number of candidates written. Linear in n plus the words between the smallest and largest id. */
int64_t ts_prefetch_pages(int64_t n, const int64_t *ids, const int64_t *counts, const uint8_t *resident,
                          const int16_t *tex, const int8_t *level, const int32_t *parent, const int32_t *own,
                          int64_t capacity, const int64_t *level_first, const int64_t *tiles_x,
                          const int64_t *tiles_y, const double *priority, int64_t n_textures, int64_t max_levels,
                          int64_t score_limit, int64_t *scratch, uint64_t *bits, int64_t *out_ids,
                          int64_t *out_weights) {
    int64_t lo = capacity, hi = -1, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = ids[i];
        if (id < 0 || id >= capacity || tex[id] < 0 || tex[id] >= n_textures || level[id] < 0 ||
            level[id] >= max_levels) {
            bad = 1;
            continue;
        }
        const int64_t t = tex[id], lv = level[id], row = t * max_levels;
        const int64_t tx = tiles_x[row + lv], ty = tiles_y[row + lv], off = id - level_first[row + lv];
        if (tx < 1 || ty < 1 || off < 0 || off >= tx * ty) {
            bad = 1;
            continue;
        }
        const int64_t x = off % tx, y = off / tx, c = counts[i] > 1 ? counts[i] : 1;
        int64_t cand[8], k = 0;
        if (x > 0)
            cand[k++] = id - 1;
        if (x < tx - 1)
            cand[k++] = id + 1;
        if (y > 0)
            cand[k++] = id - tx;
        if (y < ty - 1)
            cand[k++] = id + tx;
        if (lv > 0 && resident[i]) {
            const int64_t ctx = tiles_x[row + lv - 1], cty = tiles_y[row + lv - 1];
            const int64_t base = level_first[row + lv - 1] + 2 * y * ctx + 2 * x;
            const int right = 2 * x + 1 < ctx, down = 2 * y + 1 < cty;
            cand[k++] = base;
            if (right)
                cand[k++] = base + 1;
            if (down)
                cand[k++] = base + ctx;
            if (right && down)
                cand[k++] = base + ctx + 1;
        }
        for (int64_t j = 0; j < k; j++) {
            const int64_t page = cand[j];
            if (page < 0 || page >= capacity) {
                bad = 1;
                continue;
            }
            scratch[page] += c;
            ts_mark(bits, page, &lo, &hi);
        }
    }
    const int64_t m = ts_take_marked(bits, scratch, lo, hi, out_ids, out_weights);
    int64_t uniform = 1;
    for (int64_t j = 0; j < m; j++) {
        const int64_t t = tex[out_ids[j]];
        if (t < 0 || t >= n_textures)
            bad = 1;
        else if (priority[t] != 1.0)
            uniform = 0;
    }
    if (bad)
        return -1;
    int64_t kept = 0;
    for (int64_t j = 0; j < m; j++) {
        const int64_t page = out_ids[j], up = parent[page];
        if (own[page] >= 0 || up < 0 || up >= capacity || own[up] < 0)
            continue; /* resident already, or no resident parent to draw from meanwhile */
        int64_t w = out_weights[j];
        if (!uniform) {
            const double p = ceil((double)w * priority[tex[page]]);
            w = (int64_t)(p < (double)score_limit ? p : (double)score_limit);
        }
        out_ids[kept] = page;
        out_weights[kept] = w;
        kept++;
    }
    return kept;
}

/* (Request scheduler, render thread) Queue this frame's asked-for tiles ids[0..n) (unique) with their
 * weights (requests.py's numpy `_merge` is the twin). A tile with a load in flight (loading[i] != 0)
 * is only marked wanted (last_wanted = frame); a FAILED tile (state 2) is taken only once its
 * back-off ended (retry_at <= frame; counted in counts[1]); every tile taken becomes QUEUED (1) with
 * score min(weights[i], score_limit), tier `tier` and last_wanted = frame, counted in counts[0], and
 * those that were not QUEUED before are written to out_fresh (n entries). state, retry_at,
 * last_wanted, score and tiers are the scheduler's per-tile arrays (capacity entries each). Ids
 * outside [0, capacity) are refused: returns -1 before changing anything; else the number of fresh
 * tiles written. */
int64_t ts_merge_requests(int64_t n, const int64_t *ids, const int64_t *weights, const uint8_t *loading,
                          int64_t frame, int64_t tier, int64_t score_limit, int64_t capacity, uint8_t *state,
                          const int64_t *retry_at, int64_t *last_wanted, int64_t *score, uint8_t *tiers,
                          int64_t *out_fresh, int64_t *counts) {
    const uint8_t QUEUED = 1, FAILED = 2;
    int64_t fresh = 0, queued = 0, retried = 0;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= capacity)
            return -1;
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = ids[i];
        const uint8_t st = state[id];
        if (loading[i]) {
            last_wanted[id] = frame; /* still wanted: its read is not cancelled as stale */
            continue;
        }
        if (st == FAILED) {
            if (retry_at[id] > frame)
                continue;
            retried++;
        }
        if (st != QUEUED)
            out_fresh[fresh++] = id;
        state[id] = QUEUED;
        score[id] = weights[i] < score_limit ? weights[i] : score_limit;
        tiers[id] = (uint8_t)tier;
        last_wanted[id] = frame;
        queued++;
    }
    counts[0] = queued;
    counts[1] = retried;
    return fresh;
}

/* (Request scheduler, render thread) The scheduler's queue q[0..n) cleaned and keyed for this frame's
 * order (requests.py's numpy `_live_queue` is the twin). An entry stays when its tile is still QUEUED
 * (state 1), names a tile (level >= 0), is not resident (own < 0), has no load in flight (loading[i]
 * == 0) and was wanted within `cancel_after` frames; one wanted longer ago is counted in counts[0]
 * (cancelled). Every entry that goes and whose tile is still QUEUED becomes NONE (0). The entries
 * that stay are written in order to out_q with their ordering keys (uint64: class << 62 | score << 35
 * | (max_levels - 1 - level) << 31 | id, where a tile wanted this frame has class = its tier and
 * score = score_limit - min(score, score_limit), any other class 2 and score 0). `flags` holds n
 * bytes of working space. Ids outside [0, capacity) are refused: returns -1 before changing
 * anything; else the number of entries that stay. */
int64_t ts_queue_keys(int64_t n, const int64_t *q, const uint8_t *loading, int64_t capacity, uint8_t *state,
                      const int8_t *level, const int32_t *own, const int64_t *last_wanted, const int64_t *score,
                      const uint8_t *tiers, int64_t frame, int64_t cancel_after, int64_t max_levels,
                      int64_t score_limit, uint8_t *flags, int64_t *out_q, uint64_t *out_keys, int64_t *counts) {
    const uint8_t NONE = 0, QUEUED = 1;
    int64_t cancelled = 0, m = 0;
    for (int64_t i = 0; i < n; i++)
        if (q[i] < 0 || q[i] >= capacity)
            return -1;
    for (int64_t i = 0; i < n; i++) { /* classified against the states before any change */
        const int64_t id = q[i];
        const int live = state[id] == QUEUED && level[id] >= 0 && own[id] < 0 && !loading[i];
        const int stale = live && frame - last_wanted[id] >= cancel_after;
        flags[i] = live && !stale;
        cancelled += stale;
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = q[i];
        if (!flags[i]) {
            if (state[id] == QUEUED)
                state[id] = NONE;
            continue;
        }
        const int fresh = last_wanted[id] == frame;
        const int64_t s = score[id] < score_limit ? score[id] : score_limit;
        const uint64_t klass = fresh ? tiers[id] : 2, weight = fresh ? (uint64_t)(score_limit - s) : 0;
        const uint64_t finer = (uint64_t)(max_levels - 1 - level[id]);
        out_q[m] = id;
        out_keys[m] = klass << 62 | weight << 35 | finer << 31 | (uint64_t)id;
        m++;
    }
    counts[0] = cancelled;
    return m;
}

/* Sift key heap[at] down a max-heap of `size` keys. */
static void ts_sift_down(int64_t *heap, int64_t size, int64_t at) {
    const int64_t key = heap[at];
    for (;;) {
        int64_t child = 2 * at + 1;
        if (child >= size)
            break;
        if (child + 1 < size && heap[child + 1] > heap[child])
            child++;
        if (heap[child] <= key)
            break;
        heap[at] = heap[child];
        at = child;
    }
    heap[at] = key;
}

/* (Cache ledgers, render thread) A frame's arrivals into every pool at once: slot slots[i] of pool
 * pools[i] goes from state `from` to state `to` and counts as used at `frame` (last_used raised to
 * it); slots.py's numpy `SlotLedger.mark_resident`, pool by pool, is the twin. Pool p's ledger arrays
 * are at state_at[p] (uint8) and used_at[p] (int64), capacity[p] slots (0: no pool), p < n_pools. All
 * or nothing: an entry naming no pool, a slot outside its pool or not in state `from` refuses the
 * call before anything is written, returning -(1 + its index); else 0. */
int64_t ts_move_pools(int64_t n, const int64_t *slots, const int64_t *pools, int64_t n_pools, const int64_t *state_at,
                      const int64_t *used_at, const int64_t *capacity, int64_t frame, int64_t from, int64_t to) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t p = pools[i], s = slots[i];
        if (p < 0 || p >= n_pools || s < 0 || s >= capacity[p])
            return -(1 + i);
        if (((const uint8_t *)(uintptr_t)state_at[p])[s] != from)
            return -(1 + i);
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t p = pools[i], s = slots[i];
        uint8_t *state = (uint8_t *)(uintptr_t)state_at[p];
        int64_t *last_used = (int64_t *)(uintptr_t)used_at[p];
        state[s] = (uint8_t)to;
        last_used[s] = last_used[s] > frame ? last_used[s] : frame;
    }
    return 0;
}

/* (Cache ledgers, render thread) A use at `frame` of the slots ts_sample_slots found, in every pool
 * at once: pool p's are slots[p * stride .. p * stride + counts[p]) (counts above stride are
 * clipped), its ledger's last_used at used_at[p] with capacity[p] slots (0: no pool, skipped); slots
 * outside their pool (-1 included) are skipped. slots.py's numpy `SlotLedger.touch`, pool by pool, is
 * the twin. Returns how many slots were touched. */
int64_t ts_touch_pools(int64_t n_pools, const int64_t *slots, int64_t stride, const int64_t *counts,
                       const int64_t *used_at, const int64_t *capacity, int64_t frame) {
    int64_t touched = 0;
    for (int64_t p = 0; p < n_pools; p++) {
        if (capacity[p] <= 0)
            continue;
        int64_t *last_used = (int64_t *)(uintptr_t)used_at[p];
        const int64_t m = counts[p] < stride ? counts[p] : stride;
        for (int64_t i = 0; i < m; i++) {
            const int64_t s = slots[p * stride + i];
            if (s < 0 || s >= capacity[p])
                continue;
            last_used[s] = frame;
            touched++;
        }
    }
    return touched;
}

/* (Cache ledger, render thread) A pool's `count` victims (slots.py's numpy `_pick_victims` is the
 * twin): among the slots s in [0, capacity) that are RESIDENT (state 2), unpinned and unused for
 * `fif` frames (last_used <= frame - fif), those of the smallest keys
 * (min(floor(idle * 16), idle_clip) * -64 + level) << slot_bits | s, idle = frame - last_used divided
 * by priority[tex] when `priority` is given (else NULL): longest idle first, then finer levels,
 * then lower slots. The keys are distinct (the slot in the low bits), so the choice is exact. Their
 * keys go to out_keys (count entries) in ascending order; the slot is a key's low slot_bits bits.
 * A candidate's texture outside [0, n_textures) is refused: returns -1; else the number of victims,
 * min(count, candidates). One pass over the slots with a heap of `count` keys, then a heap sort. */
int64_t ts_victim_keys(int64_t capacity, const uint8_t *state, const uint8_t *pinned, const int64_t *last_used,
                       const int16_t *tex, const int8_t *level, const double *priority, int64_t n_textures,
                       int64_t frame, int64_t fif, int64_t idle_clip, int64_t slot_bits, int64_t count,
                       int64_t *out_keys) {
    int64_t size = 0;
    const int64_t before = frame - fif;
    if (count <= 0)
        return 0;
    for (int64_t s = 0; s < capacity; s++) {
        if (state[s] != 2 || pinned[s] || last_used[s] > before)
            continue;
        double idle = (double)(frame - last_used[s]);
        if (priority != NULL) {
            const int64_t t = tex[s];
            if (t < 0 || t >= n_textures)
                return -1;
            idle /= priority[t];
        }
        double sixteenths = floor(idle * 16.0);
        if (sixteenths > (double)idle_clip)
            sixteenths = (double)idle_clip;
        const int64_t key = (int64_t)((uint64_t)((int64_t)sixteenths * -64 + level[s]) << slot_bits) | s;
        if (size < count) { /* fill the heap, then keep the smallest keys: the largest on top */
            int64_t at = size++;
            while (at > 0 && out_keys[(at - 1) / 2] < key) {
                out_keys[at] = out_keys[(at - 1) / 2];
                at = (at - 1) / 2;
            }
            out_keys[at] = key;
        } else if (key < out_keys[0]) {
            out_keys[0] = key;
            ts_sift_down(out_keys, size, 0);
        }
    }
    for (int64_t end = size - 1; end > 0; end--) { /* heap sort: ascending */
        const int64_t top = out_keys[0];
        out_keys[0] = out_keys[end];
        out_keys[end] = top;
        ts_sift_down(out_keys, end, 0);
    }
    return size;
}

/* (Render thread) The cache slot every page of ids[0..n) samples and the one its parent samples
 * (trilinear filtering reads both), grouped by pool: a page samples its own tile when resident
 * (own[id] >= 0), else its nearest resident ancestor (walking parent[]); a page with none is skipped.
 * Slots of pool p are written from out[p * stride] on and counted in out_count[p] (n_pools entries,
 * zeroed here); stride must be >= 2 n. pool_of[t] is texture t's pool (tex[id] names the texture).
 * Pages of no texture or of a texture whose pool is outside [0, n_pools) are skipped; ids outside
 * [0, capacity) are refused: returns -1. Otherwise the number of slots written. The walk is at most `max_levels` steps
 * a page, so a corrupt parent table cannot loop. */
int64_t ts_sample_slots(int64_t n, const int64_t *ids, const int32_t *parent, const int32_t *own, const int16_t *tex,
                        int64_t capacity, const int64_t *pool_of, int64_t n_textures, int64_t n_pools,
                        int64_t max_levels, int64_t *out, int64_t stride, int64_t *out_count) {
    int64_t total = 0;
    for (int64_t p = 0; p < n_pools; p++)
        out_count[p] = 0;
    if (stride < 2 * n)
        return -1;
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = ids[i];
        if (id < 0 || id >= capacity)
            return -1;
        const int64_t t = tex[id];
        if (t < 0 || t >= n_textures)
            continue; /* a page of no open texture */
        const int64_t pool = pool_of[t];
        if (pool < 0 || pool >= n_pools)
            continue; /* a texture without a pool (not attached yet) or of a pool not asked for */
        const int64_t up = parent[id];
        const int64_t pages[2] = {id, up};
        for (int q = 0; q < 2; q++) {
            int64_t cur = pages[q];
            for (int64_t step = 0; cur >= 0 && step <= max_levels; step++) {
                if (cur >= capacity)
                    return -1;
                if (own[cur] >= 0)
                    break;
                cur = parent[cur];
            }
            if (cur < 0 || cur >= capacity || own[cur] < 0)
                continue;
            out[pool * stride + out_count[pool]++] = own[cur];
            total++;
        }
    }
    return total;
}

/* Outcome of ts_hdr_scanlines (keep in sync with assets/hdr.py's HdrStatus). */
enum {
    TS_HDR_OK = 0,
    TS_HDR_TRUNCATED = 1, /* the bytes end inside scanline `row` */
    TS_HDR_OLD_RLE = 2,   /* a flat scanline holds the old encoding's run markers (1 1 1 n) */
    TS_HDR_WIDTH = 3,     /* an encoded scanline's header names another width (`value`) */
    TS_HDR_RUN_PAST = 4,  /* a repeat run goes past the scanline's end */
    TS_HDR_BAD_RUN = 5,   /* a literal run of 0 texels, or one past the scanline's end (`value`: the count) */
};

/* (HDR reader) Decode `height` scanlines of `width` texels from data[pos..size) into `out`
 * (height * width * 4 RGBE bytes, row after row). Each scanline is either the "new" run-length
 * encoding (when `encodable`, i.e. 8 <= width <= 32767, and it starts 2 2 w>>8 w&255 with the top
 * bit of w>>8 clear: then R, G, B, E each as runs, a count above 128 repeating the next byte
 * count - 128 times, a count of 1..128 copying that many bytes) or flat RGBE quadruples. Every read
 * is checked against `size` and every write against the scanline's `width`, so no input reads or
 * writes out of bounds; the work is linear in the bytes read. Returns the offset after the last
 * scanline, or -1 with result[0] the TS_HDR_* code, result[1] the scanline and result[2] the value. */
int64_t ts_hdr_scanlines(const uint8_t *data, int64_t size, int64_t pos, int64_t width, int64_t height, int encodable,
                         uint8_t *out, int64_t *result) {
    result[0] = TS_HDR_OK;
    result[1] = 0;
    result[2] = 0;
    for (int64_t y = 0; y < height; y++) {
        uint8_t *row = out + y * width * 4;
        result[1] = y;
        if (pos < 0 || pos > size || size - pos < 4) {
            result[0] = TS_HDR_TRUNCATED;
            return -1;
        }
        const uint8_t *p = data + pos;
        if (!(encodable && p[0] == 2 && p[1] == 2 && !(p[2] & 0x80))) {
            if (size - pos < 4 * width) {
                result[0] = TS_HDR_TRUNCATED;
                return -1;
            }
            for (int64_t x = 0; x < width; x++) {
                if (p[4 * x] == 1 && p[4 * x + 1] == 1 && p[4 * x + 2] == 1) {
                    result[0] = TS_HDR_OLD_RLE;
                    return -1;
                }
            }
            memcpy(row, p, (size_t)(4 * width));
            pos += 4 * width;
            continue;
        }
        int64_t declared = ((int64_t)p[2] << 8) | p[3];
        if (declared != width) {
            result[0] = TS_HDR_WIDTH;
            result[2] = declared;
            return -1;
        }
        pos += 4;
        for (int c = 0; c < 4; c++) {
            int64_t filled = 0;
            while (filled < width) {
                if (pos >= size) {
                    result[0] = TS_HDR_TRUNCATED;
                    return -1;
                }
                int64_t count = data[pos];
                if (count > 128) {
                    count -= 128;
                    if (pos + 1 >= size) {
                        result[0] = TS_HDR_TRUNCATED;
                        return -1;
                    }
                    if (filled + count > width) {
                        result[0] = TS_HDR_RUN_PAST;
                        return -1;
                    }
                    const uint8_t v = data[pos + 1];
                    for (int64_t k = 0; k < count; k++) row[4 * (filled + k) + c] = v;
                    pos += 2;
                } else {
                    if (count == 0 || filled + count > width) {
                        result[0] = TS_HDR_BAD_RUN;
                        result[2] = count;
                        return -1;
                    }
                    if (size - (pos + 1) < count) {
                        result[0] = TS_HDR_TRUNCATED;
                        return -1;
                    }
                    const uint8_t *src = data + pos + 1;
                    for (int64_t k = 0; k < count; k++) row[4 * (filled + k) + c] = src[k];
                    pos += 1 + count;
                }
                filled += count;
            }
        }
    }
    return pos;
}

/* (HDR reader) `n` RGBE texels -> `n` float32 RGB texels: channel c of texel i is
 * table[(E << 8) | M_c], the table holding (m + 0.5) * 2^(e - 136) (0 for e == 0) for every (e, m). */
void ts_rgbe_to_float(const uint8_t *rgbe, int64_t n, const float *table, float *out) {
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *t = rgbe + 4 * i;
        const float *row = table + ((size_t)t[3] << 8);
        out[3 * i] = row[t[0]];
        out[3 * i + 1] = row[t[1]];
        out[3 * i + 2] = row[t[2]];
    }
}

/* The bake loops and the procedural loops below are bit-for-bit twins of numpy's separate float32
 * operations: no float arithmetic may be contracted (fused multiply-add). */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
/* Vectorized (O3; setup.py adds -fno-math-errno so sqrtf inlines): neither changes a result. */
#pragma GCC optimize("O3", "fp-contract=off")
#endif

/* The bake and procedural loops are also compiled for AVX2 and picked at load time where the toolchain can
 * (GCC on x86-64 Linux: ifunc): the same IEEE operations on wider vectors, so the same bits (no FMA:
 * contraction is off, and AVX2 code uses no FMA instruction unless contracted). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(__SANITIZE_ADDRESS__)
#define TS_WIDE __attribute__((target_clones("avx2", "default")))
#else
#define TS_WIDE
#endif

/* ---- bake loops: mip reduction and float -> 8-bit encoding (bake/mips.py's numpy twins, bit for bit) ---------
 *
 * Written as flat loops over contiguous floats (a vertical pass of two rows into a scratch row, then a
 * horizontal pass over texel pairs) so that the compiler vectorizes them (O3 above; AVX2 through
 * TS_WIDE): the same float32 additions in the same order as the numpy path, so the same bits. Each
 * checks its geometry (rows >= 0, width >= 1, row strides holding a row) and returns -1 without
 * touching memory when it does not hold, -2 when the scratch row cannot be allocated, 0 otherwise.
 * Tables: 65536 float pairs (indexed by a u16) for the reductions, 2^20 codes (indexed by a float's top 20
 * bits) for the encoding: no index can leave them. */

static int ts_bad_geometry(int64_t rows, int64_t width, int64_t src_stride, int64_t src_row, int64_t dst_stride,
                           int64_t dst_row) {
    return rows < 0 || width < 1 || width > (INT64_MAX / 16) || src_stride < src_row || dst_stride < dst_row;
}

/* The horizontal half of a 2x2 box: texel j of the output row is texel 2j plus texel 2j + 1 of the
 * vertical sums `v` (an odd width's last texel pairs with itself under clamp, with texel 0 under wrap),
 * times `scale` (1 when the table applied the 1/4 already: multiplying by 1 changes no bit). */
static inline void ts_pair_columns(const float *restrict v, int64_t width, int wrap, float scale, float *restrict o) {
    const int64_t half = width / 2;
    for (int64_t j = 0; j < half; j++)
        for (int c = 0; c < 4; c++) o[4 * j + c] = (v[8 * j + c] + v[8 * j + 4 + c]) * scale;
    if (width % 2) {
        const int64_t c1 = wrap ? 0 : width - 1;
        for (int c = 0; c < 4; c++) o[4 * half + c] = (v[4 * (width - 1) + c] + v[4 * c1 + c]) * scale;
    }
}

/* (bake workers) The first 2x2 box reduction of a band: an even number of rows of 8-bit RGBA texels
 * -> float32 linear texels (an odd last row is left out, as the caller never passes one). The twin of
 * mips.Transfer.reduce's numpy path for uint8 rows, bit for bit: `pairs` (mips._pair_table, 65536 x 2
 * floats) maps two bytes read as a little-endian u16 to their two linear values already scaled by 1/4
 * (exact: a power of two), so one lookup serves two channels; each output channel is
 * (t[r0c0] + t[r1c0]) + (t[r0c1] + t[r1c1]) summed in float32 in that order, and an odd width's last
 * texel pairs with itself (clamp) or with column 0 (wrap). With `alpha_from_bytes` (sRGB colour with
 * real alpha) alpha is the sum of the four bytes times float32(1/1020) instead. Only additions and
 * one multiply: no contraction can change a result. Row strides are in bytes (src) and floats (dst). */
/* One output row of ts_mip_reduce_rgba8 from source rows `a` and `b`; `v` is a scratch row of 4 * width floats. */
static inline void ts_reduce_rgba8_row(const uint8_t *restrict a, const uint8_t *restrict b, int64_t width,
                                       const float *pairs, int alpha_from_bytes, int wrap, float *restrict v,
                                       float *restrict o) {
    /* Two bytes at a time: one lookup of the pair table gives both channels' values. */
    for (int64_t x = 0; x < 2 * width; x++) {
        uint16_t ia, ib;
        memcpy(&ia, a + 2 * x, 2);
        memcpy(&ib, b + 2 * x, 2);
        const float *ta = pairs + 2 * (size_t)ia, *tb = pairs + 2 * (size_t)ib;
        v[2 * x] = ta[0] + tb[0];
        v[2 * x + 1] = ta[1] + tb[1];
    }
    ts_pair_columns(v, width, wrap, 1.0f, o);
    if (alpha_from_bytes) {
        const float k = (float)(1.0 / 1020.0);
        for (int64_t j = 0; j < (width + 1) / 2; j++) {
            const int64_t c0 = 2 * j, c1 = c0 + 1 < width ? c0 + 1 : (wrap ? 0 : width - 1);
            const unsigned total = (unsigned)a[4 * c0 + 3] + b[4 * c0 + 3] + a[4 * c1 + 3] + b[4 * c1 + 3];
            o[4 * j + 3] = (float)total * k;
        }
    }
}

TS_WIDE int64_t ts_mip_reduce_rgba8(const uint8_t *src, int64_t rows, int64_t width, int64_t src_stride,
                                    const float *pairs, int alpha_from_bytes, int wrap, float *dst, int64_t dst_stride) {
    const int64_t out_w = (width + 1) / 2;
    if (ts_bad_geometry(rows, width, src_stride, 4 * width, dst_stride, 4 * out_w)) return -1;
    float *v = malloc((size_t)(4 * width) * sizeof(float));
    if (v == NULL) return -2;
    for (int64_t r = 0; r + 1 < rows; r += 2) {
        const uint8_t *a = src + r * src_stride;
        ts_reduce_rgba8_row(a, a + src_stride, width, pairs, alpha_from_bytes, wrap, v, dst + (r / 2) * dst_stride);
    }
    free(v);
    return 0;
}

/* (bake workers) The 2x2 box reduction of float32 linear rows (every reduction after a band's first):
 * ((r0c0 + r1c0) + (r0c1 + r1c1)) * 0.25f per channel, the numpy path's order; an odd width's last
 * texel pairs as in ts_mip_reduce_rgba8. Strides are in floats. */
TS_WIDE int64_t ts_mip_reduce_f32(const float *src, int64_t rows, int64_t width, int64_t src_stride, int wrap, float *dst,
                              int64_t dst_stride) {
    const int64_t out_w = (width + 1) / 2;
    if (ts_bad_geometry(rows, width, src_stride, 4 * width, dst_stride, 4 * out_w)) return -1;
    float *v = malloc((size_t)(4 * width) * sizeof(float));
    if (v == NULL) return -2;
    for (int64_t r = 0; r + 1 < rows; r += 2) {
        const float *restrict a = src + r * src_stride, *restrict b = a + src_stride;
        for (int64_t x = 0; x < 4 * width; x++) v[x] = a[x] + b[x];
        ts_pair_columns(v, width, wrap, 0.25f, dst + (r / 2) * dst_stride);
    }
    free(v);
    return 0;
}

/* round(v * 255) as numpy computes it: v * 255.0f, then + (0.5f + 1/512) (two float32 roundings: the
 * file's fp-contract=off keeps them apart), NaN or below 0 -> 0, above 255 -> 255, truncated. */
static inline uint8_t ts_code_plain(float v) {
    float t = v * 255.0f;
    t = t + 0.501953125f; /* float32(0.5 + 1/512), exact */
    t = t > 0.0f ? t : 0.0f; /* NaN too, as numpy's fmax(t, 0) */
    t = t > 255.0f ? 255.0f : t;
    return (uint8_t)(int32_t)t;
}

static inline uint8_t ts_code_table(const float *v, const uint8_t *table) {
    uint32_t bits;
    memcpy(&bits, v, 4);
    return table[bits >> 12];
}

/* (bake workers) float32 linear texels -> 8-bit codes, in one pass: the twin of mips.Transfer.encode's
 * numpy path, bit for bit. A channel whose bit is set in `table_mask` takes table[bits >> 12] (the sRGB
 * curve: one rounded code per float32 bin, 2^20 entries); the others take `ts_code_plain`. The three
 * masks the baker uses (linear 0, sRGB opaque 0xF, sRGB with alpha 0x7) each have their own loop.
 * Strides: floats (src), bytes (dst). */
/* One row of ts_mip_encode_f32 (`table_mask` already within 0xF). */
static inline void ts_encode_row(const float *restrict a, int64_t width, const uint8_t *table, int table_mask,
                                 uint8_t *restrict o) {
    if (table_mask == 0) {
        for (int64_t i = 0; i < 4 * width; i++) o[i] = ts_code_plain(a[i]);
    } else if (table_mask == 0xF) {
        for (int64_t i = 0; i < 4 * width; i++) o[i] = ts_code_table(a + i, table);
    } else if (table_mask == 0x7) {
        for (int64_t j = 0; j < width; j++) {
            o[4 * j] = ts_code_table(a + 4 * j, table);
            o[4 * j + 1] = ts_code_table(a + 4 * j + 1, table);
            o[4 * j + 2] = ts_code_table(a + 4 * j + 2, table);
            o[4 * j + 3] = ts_code_plain(a[4 * j + 3]);
        }
    } else {
        for (int64_t i = 0; i < 4 * width; i++)
            o[i] = (table_mask >> (i & 3) & 1) ? ts_code_table(a + i, table) : ts_code_plain(a[i]);
    }
}

TS_WIDE int64_t ts_mip_encode_f32(const float *src, int64_t rows, int64_t width, int64_t src_stride, const uint8_t *table,
                                  int table_mask, uint8_t *dst, int64_t dst_stride) {
    if (ts_bad_geometry(rows, width, src_stride, 4 * width, dst_stride, 4 * width)) return -1;
    for (int64_t r = 0; r < rows; r++) ts_encode_row(src + r * src_stride, width, table, table_mask & 0xF, dst + r * dst_stride);
    return 0;
}

/* (bake workers) A band's first two reductions in one pass, for colour without premultiplied alpha:
 * 8-bit rows of a level -> the next level's rows as 8-bit codes (`dst1`, what its tiles are cut from)
 * and the level after as float32 linear (`dst2`), without the middle level's float rows ever leaving
 * two scratch rows. The same operations as ts_mip_reduce_rgba8, then ts_mip_encode_f32 and
 * ts_mip_reduce_f32 on its output (bit for bit the three calls, and numpy's path). Middle row i is made
 * from source rows 2i and 2i + 1 (rows / 2 of them); last row j from middle rows first_pair + 2j and
 * first_pair + 2j + 1 (first_pair 0 or 1, rows2 of them, all within the middle rows: the caller keeps
 * the odd edge's extra row to the general path). Strides: bytes (src, dst1), floats (dst2). */
TS_WIDE int64_t ts_mip_reduce_twice_rgba8(const uint8_t *src, int64_t rows, int64_t width, int64_t src_stride,
                                          const float *pairs, int alpha_from_bytes, int wrap, const uint8_t *codes,
                                          int code_mask, uint8_t *dst1, int64_t dst1_stride, int64_t first_pair,
                                          int64_t rows2, float *dst2, int64_t dst2_stride) {
    const int64_t w1 = (width + 1) / 2, w2 = (w1 + 1) / 2, n1 = rows / 2;
    if (ts_bad_geometry(rows, width, src_stride, 4 * width, dst1_stride, 4 * w1) || dst2_stride < 4 * w2 ||
        first_pair < 0 || first_pair > 1 || rows2 < 0 || first_pair + 2 * rows2 > n1)
        return -1;
    float *v = malloc((size_t)(4 * width + 8 * w1) * sizeof(float));
    if (v == NULL) return -2;
    float *mid[2] = {v + 4 * width, v + 4 * width + 4 * w1};
    for (int64_t i = 0; i < n1; i++) {
        const uint8_t *a = src + 2 * i * src_stride;
        float *m = mid[i & 1];
        ts_reduce_rgba8_row(a, a + src_stride, width, pairs, alpha_from_bytes, wrap, v, m);
        ts_encode_row(m, w1, codes, code_mask & 0xF, dst1 + i * dst1_stride);
        const int64_t k = i - first_pair;
        if (k >= 1 && k % 2 == 1 && k / 2 < rows2) {
            const float *up = mid[(i - 1) & 1];
            for (int64_t x = 0; x < 4 * w1; x++) v[x] = up[x] + m[x];
            ts_pair_columns(v, w1, wrap, 0.25f, dst2 + (k / 2) * dst2_stride);
        }
    }
    free(v);
    return 0;
}

/* ---- procedural sources (bake/procedural.py's twins, bit for bit) --------------------------------------
 * ts_lattice_noise   hashed white noise on a lattice block, times an octave's amplitude;
 * ts_subdivide_add   one Chaikin subdivision step in both axes (rows first), added to a block;
 * ts_height_rows     the last subdivision to texels, central differences and the per-texel work of the
 *                    terrain colour (one table gather) or the normal map, streaming three texel rows.
 * Every float operation is a float32 operation in numpy's order, each rounded (no contraction: the
 * pragma above the bake loops covers these too); float -> int32 casts give INT32_MIN for NaN or out of
 * range, as x86's conversion numpy relies on, and int32 arithmetic wraps as numpy's does. */
static inline uint32_t ts_mix32(uint32_t h) {
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    h *= 0x297A2D39u;
    h ^= h >> 15;
    return h;
}

static inline int64_t ts_floor_half(int64_t v) { return (v - (v & 1)) / 2; }

static inline int32_t ts_to_i32(float v) {
    return (v > -2147483904.0f && v < 2147483648.0f) ? (int32_t)v : INT32_MIN;
}

/* Noise in [-1, 1) at lattice points [r0, r0 + rows) x [c0, c0 + cols), times `amp`: hash
 * mix(mix(row * 0x165667B1 ^ salt) ^ col * 0x27D4EB2D) (coordinates taken mod 2^32), top 24 bits
 * * 2^-23 - 1, then * amp. `out` row stride in floats. */
TS_WIDE void ts_lattice_noise(int64_t r0, int64_t rows, int64_t c0, int64_t cols, uint32_t salt, float amp, float *out,
                      int64_t out_stride) {
    const float unit = (float)(2.0 / (1 << 24));
    for (int64_t r = 0; r < rows; r++) {
        const uint32_t hy = ts_mix32((uint32_t)(r0 + r) * 0x165667B1u ^ salt);
        float *o = out + r * out_stride;
        for (int64_t c = 0; c < cols; c++) {
            const uint32_t h = ts_mix32(hy ^ (uint32_t)(c0 + c) * 0x27D4EB2Du);
            float v = (float)(h >> 8);
            v = v * unit;
            v = v - 1.0f;
            o[c] = v * amp;
        }
    }
}

/* Is coarse [first, first + count) enough to subdivide fine [lo, hi)? (procedural._parent_range) */
static inline int ts_covers(int64_t first, int64_t count, int64_t lo, int64_t hi) {
    return hi > lo && ts_floor_half(lo - 1) >= first && ts_floor_half(hi - 2) + 2 <= first + count;
}

enum { TS_TERRAIN = 0, TS_NORMALS = 1 };

/* Fine row f of a coarse block (rows from coarse index `first`, `cols` wide, stride in floats). */
TS_WIDE static void ts_subdivide_row(const float *c, int64_t stride, int64_t first, int64_t cols, int64_t f, float *dst) {
    const int64_t i = (f & 1) ? ts_floor_half(f - 1) : ts_floor_half(f) - 1;
    const float *a = c + (i - first) * stride, *b = a + stride;
    if (f & 1) {
        for (int64_t j = 0; j < cols; j++) {
            float q = b[j] - a[j];
            q = q * 0.25f;
            dst[j] = a[j] + q;
        }
    } else {
        for (int64_t j = 0; j < cols; j++) {
            float q = b[j] - a[j];
            q = q * 0.25f;
            dst[j] = b[j] - q;
        }
    }
}

/* Fine samples 2i + 1 and 2i + 2 of coarse pairs i = lo .. lo + pairs - 1 of row `c` (index 0 is
 * coarse index `first`), in order from fine index 2 lo + 1. */
TS_WIDE static void ts_subdivide_across(const float *c, int64_t first, int64_t lo, int64_t pairs, float *dst) {
    const float *a = c + (lo - first);
    for (int64_t p = 0; p < pairs; p++) {
        float q = a[p + 1] - a[p];
        q = q * 0.25f;
        dst[2 * p] = a[p] + q;
        dst[2 * p + 1] = a[p + 1] - q;
    }
}

/* dst[a0..a1) x [b0..b1) += the subdivision of `src` (rows p0.., cols q0.., src_rows x src_cols,
 * stride in floats): each fine row by rows first, then columns, as numpy's _subdivide(axis 0) then
 * (axis 1). `tmp`: 3 * src_cols + 4 floats (`tmp_len`). Returns 0, or -1 (nothing written) when src
 * does not cover the block or tmp is short. */
int64_t ts_subdivide_add(const float *src, int64_t src_rows, int64_t src_cols, int64_t src_stride, int64_t p0,
                         int64_t q0, int64_t a0, int64_t a1, int64_t b0, int64_t b1, float *tmp, int64_t tmp_len,
                         float *dst, int64_t dst_stride) {
    if (!ts_covers(p0, src_rows, a0, a1) || !ts_covers(q0, src_cols, b0, b1) || src_cols > src_stride) return -1;
    if (tmp_len < 3 * src_cols + 4) return -1;
    /* Coarse pairs lo .. hi - 1 give fine columns 2 lo + 1 .. 2 hi, which hold b0 .. b1 - 1. */
    const int64_t lo = ts_floor_half(b0 - 1), pairs = ts_floor_half(b1 - 2) + 1 - lo, skip = b0 - (2 * lo + 1);
    float *across = tmp, *fine = tmp + src_cols;
    for (int64_t f = a0; f < a1; f++) {
        ts_subdivide_row(src, src_stride, p0, src_cols, f, across);
        ts_subdivide_across(across, q0, lo, pairs, fine);
        float *restrict o = dst + (f - a0) * dst_stride;
        const float *restrict v = fine + skip;
        for (int64_t g = 0; g < b1 - b0; g++) o[g] += v[g];
    }
    return 0;
}

/* One normal channel's byte: clip((v + 1) * 127.5 + 0.5, 0, 255) truncated (NaN -> 0). */
static inline uint8_t ts_unit_byte(float v) {
    float t = v + 1.0f;
    t = t * 127.5f;
    t = t + 0.5f;
    t = t > 0.0f ? t : 0.0f;
    t = t > 255.0f ? 255.0f : t;
    return (uint8_t)(int32_t)t;
}

TS_WIDE static void ts_normal_row(const float *restrict up, const float *restrict mid, const float *restrict down,
                          int64_t width, uint8_t *restrict o) {
    for (int64_t x = 0; x < width; x++) {
        const float h = mid[x + 1];
        const float land = h > 0.0f ? 0.5f : 0.0f;
        float dx = mid[x + 2] - mid[x];
        float dy = down[x + 1] - up[x + 1];
        dx = dx * land;
        dy = dy * land;
        float len = dx * dx;
        len = len + dy * dy;
        len = len + 1.0f;
        const float inv = 1.0f / sqrtf(len);
        const uint8_t texel[4] = {ts_unit_byte(-dx * inv), ts_unit_byte(-dy * inv), ts_unit_byte(inv), 255};
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        /* One 4-byte store per texel (the loop vectorizes; four byte stores do not). */
        const uint32_t packed = (uint32_t)texel[0] | (uint32_t)texel[1] << 8 | (uint32_t)texel[2] << 16 | 0xFF000000u;
        memcpy(o + 4 * x, &packed, 4);
#else
        memcpy(o + 4 * x, texel, 4);
#endif
    }
}

/* The terrain's table index of each texel, then the gather. The float -> int32 casts are written as
 * numpy's x86 ones act (INT32_MIN for NaN or out of range) followed by its clips, in branch-free
 * form: a height bin outside 0 .. 2^31 or NaN clips to 0; a NaN shade bin adds INT32_MIN * S_step,
 * which wraps to 0; a NaN slope bin adds INT32_MIN (the index then clips to 0). */
TS_WIDE static void ts_terrain_row(const float *restrict up, const float *restrict mid, const float *restrict down,
                           int64_t width, const float *k, const int64_t *bins, const uint32_t *table,
                           int64_t table_len, int32_t *restrict index, uint8_t *o) {
    const float r_lo = k[0], r_mul = k[1], nsx = k[2], sy = k[3], sz = k[4], h_mul = k[5], h_add = k[6];
    const float s_scale = k[7], l_scale = k[8], l_max = k[9];
    const float s_top = 1.0f * s_scale + 0.5f;
    const float h_top = (float)(bins[0] - 1);
    const uint32_t h_step = (uint32_t)(bins[1] * bins[2]), s_step = (uint32_t)bins[2];
    const int32_t last = (int32_t)(table_len - 1);
    for (int64_t x = 0; x < width; x++) {
        const float h = mid[x + 1];
        float dx = mid[x + 2] - mid[x];
        float dy = down[x + 1] - up[x + 1];
        float relief = r_lo > h ? r_lo : h; /* np.maximum: NaN stays NaN */
        relief = relief - r_lo;
        relief = relief * r_mul;
        relief = relief + 0.5f;
        dx = dx * relief;
        dy = dy * relief;
        float s2 = dx * dx;
        s2 = s2 + dy * dy;
        float lam = dx * nsx;
        lam = lam - dy * sy;
        lam = lam + sz;
        s2 = s2 + 1.0f;
        s2 = sqrtf(s2);
        lam = lam / s2;
        lam = 0.0f > lam ? 0.0f : lam; /* the clip to 1 comes after the scaling, below */
        s2 = s2 * s2;
        s2 = s2 - 1.0f;
        s2 = sqrtf(s2);
        float hv = h * h_mul;
        hv = hv + h_add;
        const int in_range = (hv >= 0.0f) & (hv < 2147483648.0f);
        hv = in_range ? hv : 0.0f;
        hv = hv > h_top ? h_top : hv;
        uint32_t idx = (uint32_t)(int32_t)hv * h_step;
        lam = lam * s_scale;
        lam = lam + 0.5f;
        /* np.clip(lam, 0, 1) before the scaling, done after it: scaling and adding are monotonic, so
         * a term above 1 scales to at least s_top, which 1 scales to exactly. */
        lam = lam > s_top ? s_top : lam;
        lam = lam >= 0.0f ? lam : 0.0f; /* NaN: its INT32_MIN * s_step wraps to 0 (s_step even) */
        idx += (uint32_t)(int32_t)lam * s_step;
        s2 = s2 * l_scale;
        s2 = s2 > l_max ? l_max : s2; /* np.minimum: NaN stays NaN */
        const int slope_ok = s2 >= 0.0f;
        idx += (uint32_t)(int32_t)(slope_ok ? s2 : 0.0f) + (slope_ok ? 0u : 0x80000000u);
        int32_t at = (int32_t)idx; /* np.take(mode="clip") */
        at = at < 0 ? 0 : at;
        index[x] = at > last ? last : at;
    }
    for (int64_t x = 0; x < width; x++) memcpy(o + 4 * x, table + index[x], 4);
}

/* Texel rows [y0, y1) x [0, width) of the terrain colour (mode TS_TERRAIN: packed RGBA8 from `table`)
 * or its normals (TS_NORMALS: RGBA8, A = 255) from `g1`, the field at lattice spacing 2 (rows r0..,
 * cols c0.., g_rows x g_cols, stride in floats). `k` holds the float32 constants terrain_rows uses, in
 * this order: r_lo, r_mul, -sx, sy, sz, h_mul, h_add, S - 1, L / slope_max, L - 1; `bins` the table's
 * (H, S, L). `scratch`: g_cols + 4 * (width + 4) floats. `out` row stride in bytes. Returns 0, or -1
 * (nothing written) when g1 does not cover the rows, an argument is out of range or scratch is short. */
int64_t ts_height_rows(const float *g1, int64_t g_rows, int64_t g_cols, int64_t g_stride, int64_t r0, int64_t c0,
                       int64_t y0, int64_t y1, int64_t width, int mode, const float *k, const int64_t *bins,
                       const uint32_t *table, int64_t table_len, uint8_t *out, int64_t out_stride, float *scratch,
                       int64_t scratch_len) {
    if (width < 1 || !ts_covers(r0, g_rows, y0 - 1, y1 + 1) || !ts_covers(c0, g_cols, -1, width + 1)) return -1;
    if (g_cols > g_stride || scratch_len < g_cols + 4 * (width + 4) || out_stride < 4 * width) return -1;
    if (mode != TS_TERRAIN && mode != TS_NORMALS) return -1;
    if (mode == TS_TERRAIN && (table_len < 1 || bins[0] < 1 || bins[0] * bins[1] * bins[2] > table_len)) return -1;
    /* Coarse pairs -1 .. (width - 1) / 2 give fine columns -1 .. width (and one more when width is even);
     * ts_covers checked that c0 .. c0 + g_cols holds them. */
    const int64_t pairs = ts_floor_half(width - 1) + 2, n = width + 4;
    float *across = scratch, *ring = scratch + g_cols;
    int32_t *index = (int32_t *)(ring + 3 * n); /* float and int32 share size and alignment */
    for (int64_t f = y0 - 1; f <= y1; f++) {
        /* Texel row f, columns -1 .., into ring slot (f - y0 + 1) % 3. */
        float *row = ring + ((f - y0 + 1) % 3) * n;
        ts_subdivide_row(g1, g_stride, r0, g_cols, f, across);
        ts_subdivide_across(across, c0, -1, pairs, row);
        if (f < y0 + 1) continue;
        const int64_t y = f - 1;
        const float *up = ring + ((y - y0) % 3) * n, *mid = ring + ((y - y0 + 1) % 3) * n;
        uint8_t *o = out + (y - y0) * out_stride;
        if (mode == TS_NORMALS)
            ts_normal_row(up, mid, row, width, o);
        else
            ts_terrain_row(up, mid, row, width, k, bins, table, table_len, index, o);
    }
    return 0;
}

/* A Python module only so that pip builds and installs this file; texstream loads it with ctypes. */
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "texstream's compiled loops (used via ctypes)", -1,
                                    NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
