/* texstream's compiled helper: the two per-tile loops of the streaming core, in C.
 *
 *   ts_read_batch   (I/O threads) read a batch of tiles from a pack into staging-ring slots:
 *                   coalesced pread of file-contiguous runs, zstd/lz4 decode straight into the
 *                   slot, xxh3-64 check. Called through ctypes.CDLL, so the GIL is released for
 *                   the whole batch (one GIL round trip per batch instead of several per tile).
 *   ts_decode_batch (I/O threads) the decode + check half alone, for tiles already in memory (remote
 *                   packs: `RemoteFile` fetched them).
 *   ts_upload_cells (render thread) one glCompressedTexSubImage3D / glTexSubImage3D per tile from
 *                   the bound pixel-unpack buffer; ts_upload_runs one per run of consecutive layers. Called through ctypes.PyDLL: it keeps the GIL,
 *                   since only the render thread calls GL and the loop takes microseconds.
 *
 * No library is linked: the decoders and the hash are the C functions the zstandard, lz4 and
 * xxhash Python packages already carry, passed in as function pointers (engine/native/__init__.py
 * finds them). The pure-Python twin of ts_read_batch is engine/runtime/io_workers.py's
 * `_read_batch_python`; both must give the same status codes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
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

/* A Python module only so that pip builds and installs this file; texstream loads it with ctypes. */
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "texstream's compiled loops (used via ctypes)", -1,
                                    NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
