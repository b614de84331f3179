/* texstream's compiled helper: the per-tile loops of the streaming core and the bake, in C.
 *
 *   ts_read_batch   (I/O threads) read a batch of tiles from a pack into staging-ring slots:
 *                   coalesced pread of file-contiguous runs, zstd/lz4 decode straight into the
 *                   slot, xxh3-64 check. Called through ctypes.CDLL, so the GIL is released for
 *                   the whole batch (one GIL round trip per batch instead of several per tile).
 *   ts_decode_batch (I/O threads) the decode + check half alone, for tiles already in memory (remote
 *                   packs: `RemoteFile` fetched them).
 *   ts_upload_cells (render thread) one glCompressedTexSubImage3D / glTexSubImage3D per tile from
 *                   the bound pixel-unpack buffer; ts_upload_runs one per run of consecutive layers;
 *                   ts_copy_spans one glCopyBufferSubData per span (staging ring -> device buffer).
 *                   Called through ctypes.PyDLL: it keeps the GIL,
 *                   since only the render thread calls GL and the loop takes microseconds.
 *   ts_reduce_rgba8 (bake workers) a band's first mip reduction from 8-bit texels, in one pass (the twin
 *   ts_reduce_f32   of mips.Transfer.reduce's numpy path, bit for bit), and the later ones from float32.
 *   ts_hdr_scanlines (HDR reader) a Radiance picture's scanlines, run-length encoded or flat, into RGBE
 *                   bytes; the twin of assets/hdr.py's `_scanline`, same results and errors.
 *   ts_rgbe_to_float (HDR reader) RGBE bytes -> float32 RGB through hdr.py's 65536-entry table (the
 *                   twin of its numpy path, bit for bit: the same table lookups).
 *   ts_encode_f32   (bake workers) float32 linear texels back to 8-bit codes (mips.Transfer.encode's twin).
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

/* (bake workers) The first 2x2 box reduction of a band: an even number of rows of 8-bit RGBA texels
 * -> float32 linear texels, in one pass. The twin of mips.Transfer.reduce's numpy path for uint8 rows,
 * bit for bit: `table` maps a byte to its linear value already scaled by 1/4 (exact: a power of two),
 * each output channel is (t[r0c0] + t[r1c0]) + (t[r0c1] + t[r1c1]) summed in float32 in that order,
 * and an odd width's last texel pairs with itself (clamp) or with column 0 (wrap). With
 * `alpha_from_bytes` (sRGB colour with real alpha) alpha is the sum of the four bytes times
 * float32(1/1020) instead. Only additions and one multiply: no contraction can change a result.
 * Row strides are in bytes (src) and floats (dst). */
void ts_reduce_rgba8(const uint8_t *src, int64_t rows, int64_t width, int64_t src_stride, const float *table,
                     int alpha_from_bytes, int wrap, float *dst, int64_t dst_stride) {
    const int64_t half = width / 2, out_w = (width + 1) / 2;
    const float k = (float)(1.0 / 1020.0);
    for (int64_t r = 0; r + 1 < rows; r += 2) {
        const uint8_t *a = src + r * src_stride, *b = a + src_stride;
        float *o = dst + (r / 2) * dst_stride;
        for (int64_t j = 0; j < out_w; j++) {
            const int64_t c0 = 2 * j, c1 = j < half ? 2 * j + 1 : (wrap ? 0 : width - 1);
            const uint8_t *p0 = a + 4 * c0, *q0 = b + 4 * c0, *p1 = a + 4 * c1, *q1 = b + 4 * c1;
            for (int c = 0; c < 4; c++) {
                float v0 = table[p0[c]] + table[q0[c]];
                float v1 = table[p1[c]] + table[q1[c]];
                o[4 * j + c] = v0 + v1;
            }
            if (alpha_from_bytes) {
                unsigned total = (unsigned)p0[3] + q0[3] + p1[3] + q1[3];
                o[4 * j + 3] = (float)total * k;
            }
        }
    }
}

/* (bake workers) The 2x2 box reduction of float32 linear rows (every reduction after a band's first):
 * ((r0c0 + r1c0) + (r0c1 + r1c1)) * 0.25f per channel, the numpy path's order; an odd width's last
 * texel pairs as in ts_reduce_rgba8. Strides are in floats. */
void ts_reduce_f32(const float *src, int64_t rows, int64_t width, int64_t src_stride, int wrap, float *dst,
                   int64_t dst_stride) {
    const int64_t half = width / 2, out_w = (width + 1) / 2;
    for (int64_t r = 0; r + 1 < rows; r += 2) {
        const float *a = src + r * src_stride, *b = a + src_stride;
        float *o = dst + (r / 2) * dst_stride;
        for (int64_t j = 0; j < out_w; j++) {
            const int64_t c0 = 2 * j, c1 = j < half ? 2 * j + 1 : (wrap ? 0 : width - 1);
            for (int c = 0; c < 4; c++) {
                float v0 = a[4 * c0 + c] + b[4 * c0 + c];
                float v1 = a[4 * c1 + c] + b[4 * c1 + c];
                float sum = v0 + v1;
                o[4 * j + c] = sum * 0.25f;
            }
        }
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

/* (bake workers) float32 linear texels -> 8-bit codes, in one pass: the twin of mips.Transfer.encode's
 * numpy path, bit for bit. A channel whose bit is set in `table_mask` takes table[bits >> 12] (the sRGB
 * curve: one rounded code per float32 bin, 2^20 entries); the others take round(v * 255) as numpy
 * computes it: v * 255.0f, then + (0.5f + 1/512) (two float32 roundings, so no multiply-add may be
 * contracted), NaN or below 0 -> 0, above 255 -> 255, truncated. Strides: floats (src), bytes (dst). */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
void ts_encode_f32(const float *src, int64_t rows, int64_t width, int64_t src_stride, const uint8_t *table,
                   int table_mask, uint8_t *dst, int64_t dst_stride) {
    const float bias = 0.501953125f; /* float32(0.5 + 1/512), exact */
    for (int64_t r = 0; r < rows; r++) {
        const float *a = src + r * src_stride;
        uint8_t *o = dst + r * dst_stride;
        for (int64_t i = 0; i < 4 * width; i++) {
            const int c = (int)(i & 3);
            if (table_mask >> c & 1) {
                uint32_t bits;
                memcpy(&bits, a + i, 4);
                o[i] = table[bits >> 12];
            } else {
                float t = a[i] * 255.0f;
                t = t + bias;
                if (!(t > 0.0f)) t = 0.0f; /* NaN too, as numpy's fmax(t, 0) */
                if (t > 255.0f) t = 255.0f;
                o[i] = (uint8_t)t;
            }
        }
    }
}

/* A Python module only so that pip builds and installs this file; texstream loads it with ctypes. */
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "texstream's compiled loops (used via ctypes)", -1,
                                    NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
