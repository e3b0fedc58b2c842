/* cohort: WebDataset-layout tar shards — the member scan and the shard index.
 *
 * A shard is an uncompressed POSIX tar file (ustar, GNU or pax headers) whose
 * members are grouped into samples as WebDataset does
 * (webdataset/tariterators.py, base_plus_ext and group_by_keys): a member
 * "DIR/KEY.EXT" belongs to sample DIR/KEY, the extension starting at the
 * first '.' of the base name (lower-cased for matching); consecutive members
 * with the same key form one sample. cohort takes from a sample its image,
 * the first of KEY.jpg, KEY.jpeg, KEY.png present, and its class label,
 * KEY.cls: an ASCII decimal integer in [0, 2^31) with optional surrounding
 * white space (WebDataset's convention). Other members (KEY.json, ...) are
 * skipped; members without an extension, directories, links and pax global
 * headers are skipped. Errors (CH_ERR_FORMAT, each naming the shard, the
 * member and its byte offset): a header checksum that does not match
 * (corrupt), a member whose data runs past the end of the file, a file
 * that ends inside a header or without the two zero blocks that end every
 * tar file (truncated: the samples after a cut are never silently lost), a sample with no image or no .cls
 * (naming the key), a key whose members are not adjacent (reordered), a bad
 * .cls text, a pax record that does not parse.
 *
 * Reading a member by its offset is then a single pread: the scan records
 * the offset of each image's data, not of its header. libarchive gives no
 * member data offset (only the header's, archive_read_header_position,
 * ahead of pax/GNU long-name headers), so this is a small reader of the tar
 * header block (POSIX.1-2001 pax, "ustar Interchange Format" and GNU's
 * 'L' long names and base-256 sizes), no decompression, no link handling.
 *
 * The index (what a shard dataset opens instead of scanning every shard):
 * per shard its file name (no directory), size in bytes and mtime (seconds
 * and nanoseconds), and per sample the image data's byte offset and size,
 * the image kind (jpg/png), its width and height as its header says (0
 * when unreadable), the label and the key, in shard order then
 * member order. File layout, all integers little-endian:
 *   "CHSHIDX1" (8 bytes), u32 version = 1, u32 number of shards S,
 *   S x { u16 name length, name, u64 size, i64 mtime_s, i64 mtime_ns,
 *         u64 samples in the shard M,
 *         M x { u64 offset, u64 size, i64 label, u8 kind, u16 width, u16 height,
 *               u16 key length, key } },
 *   u32 CRC-32 (zlib's crc32) of every byte before it.
 */
#ifndef COHORT_IO_SHARDS_H
#define COHORT_IO_SHARDS_H

#include <stddef.h>
#include <stdint.h>

#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Image kinds of a sample (the member's extension). */
enum { CH_SHARD_JPEG = 1, CH_SHARD_PNG = 2 };

/* Longest member name accepted (bytes), and longest key. */
#define CH_TAR_NAME_MAX 4096
#define CH_SHARD_KEY_MAX 4096

/* One sample of a shard: its image member's data and its label. */
typedef struct {
    uint64_t offset;  /* byte offset of the image data in the shard */
    uint64_t size;    /* image data bytes */
    int64_t label;    /* the .cls value */
    uint32_t key_off; /* key = keys + key_off, key_len bytes (not NUL-ended) */
    uint16_t key_len;
    uint8_t kind;     /* CH_SHARD_JPEG or CH_SHARD_PNG */
    uint16_t width, height; /* from the image's header (PNG IHDR, JPEG SOFn); 0: unknown */
} ch_shard_sample_t;

/* One shard: where its samples are, and what its file was when scanned. */
typedef struct {
    char *name;       /* file name (no directory) */
    uint64_t size;    /* file size in bytes */
    int64_t mtime_s, mtime_ns;
    int64_t n;        /* samples */
    ch_shard_sample_t *samples;
    char *keys;       /* key bytes of all samples */
    size_t keys_len;
} ch_shard_entry_t;

/* The index of a list of shards (index order: shard by shard). */
typedef struct {
    int nshards;
    ch_shard_entry_t *shards;
    int64_t total;    /* samples over all shards */
    int64_t *first;   /* nshards + 1 prefix sums: shard s holds [first[s], first[s+1]) */
} ch_shard_index_t;

/* Reads len bytes at byte offset off of the shard into buf; returns the
 * number read (short only at end of file) or -1 with errno set. */
typedef int64_t (*ch_tar_read_fn)(void *ctx, uint64_t off, void *buf, size_t len);

/* Scan one shard of file_size bytes through read into e (its samples and
 * keys; name, size and mtime are left to the caller, e is zeroed first).
 * name is the shard's path for messages. Errors: see the top of this file;
 * CH_ERR_IO naming the shard for a read error; CH_ERR_NOMEM. On error e is
 * freed. */
ch_status ch_tar_scan(ch_tar_read_fn read, void *ctx, uint64_t file_size, const char *name,
                      ch_shard_entry_t *e);

/* Free one entry's arrays (not e itself). */
void ch_shard_entry_free(ch_shard_entry_t *e);

/* Fill idx->total and idx->first from the entries (idx->shards, nshards
 * set). CH_ERR_NOMEM. */
ch_status ch_shard_index_finish(ch_shard_index_t *idx);

/* Free an index's contents (idx itself is the caller's); zeroes it. */
void ch_shard_index_free(ch_shard_index_t *idx);

/* The shard holding global sample i (0 <= i < idx->total): binary search
 * over idx->first. */
int ch_shard_index_find(const ch_shard_index_t *idx, int64_t i);

/* Parse an index file's bytes buf[0..len) (layout above) into idx. name is
 * the file's path for messages. Errors: CH_ERR_FORMAT naming the file and
 * what is wrong (magic, version, truncated at byte N, CRC mismatch, a
 * sample outside its shard's size, a bad kind, label or name, trailing
 * bytes); CH_ERR_NOMEM. On error idx is zeroed. */
ch_status ch_shard_index_parse(const uint8_t *buf, size_t len, const char *name,
                               ch_shard_index_t *idx);

/* Serialize idx in the layout above into a new malloc'd buffer (*buf, *len).
 * CH_ERR_NOMEM; CH_ERR_INVALID for a name or key longer than 65535 bytes. */
ch_status ch_shard_index_encode(const ch_shard_index_t *idx, uint8_t **buf, size_t *len);

/* ---- writing */

/* A ustar header block for a regular file member (POSIX.1-1988 ustar,
 * magic "ustar\0" "00"): name (1 to 100 bytes, no prefix field used), size
 * bytes of data, mode 0644, uid/gid 0, empty user/group names, mtime
 * seconds since the epoch, checksum filled in; the same bytes for the same
 * arguments (cohort-pack's shards are byte-identical across runs). The
 * member's data follows, zero-padded to a multiple of 512 bytes; an archive
 * ends with two zero blocks. CH_ERR_INVALID for an empty or too long name
 * or size >= 8 GiB (the octal field's limit). */
ch_status ch_tar_header(uint8_t h[512], const char *name, uint64_t size, int64_t mtime);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_SHARDS_H */
