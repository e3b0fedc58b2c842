/* cohort: PyTorch's own weight files (.pth / .pt, torch.save of a state dict).
 *
 * Two containers (torch/serialization.py):
 *  - zip (torch >= 1.6, the default): a zip archive whose records are
 *    STORED (not compressed), data 64-byte aligned. "<prefix>/data.pkl" is
 *    the pickle, "<prefix>/data/<key>" the raw bytes of each storage,
 *    "<prefix>/version", and from torch 2.1 "<prefix>/byteorder". The
 *    prefix is "archive" or the saved file's stem: it is taken from the
 *    central directory (the one record named "<prefix>/data.pkl"), never
 *    assumed. Storage persistent ids are
 *    ('storage', torch.<T>Storage, key, location, numel).
 *  - legacy (torch < 1.6, or _use_new_zipfile_serialization=False):
 *    five consecutive pickles - the magic number 0x1950a86a20f9469cfc6c,
 *    the protocol version 1001, sys_info (little_endian must be True), the
 *    object, and the list of storage keys - then for each key in that
 *    order an int64 element count and the storage's bytes. Persistent ids
 *    are ('storage', torch.<T>Storage, key, location, numel, None).
 *
 * Zip library: minizip (Debian libminizip-dev, zlib's contrib/minizip)
 * rather than libzip: minizip tells where a record's data starts in the
 * archive (unzGetCurrentFileZStreamPos64), so a STORED record is used in
 * place in the mapped file, with no copy through small reads; libzip only
 * reads records through zip_fread. minizip checks each local header against
 * the central directory when a record is opened. The file is mapped
 * (mmap, MAP_PRIVATE) as ch_safetensors_open does, and minizip reads the
 * mapping through memory callbacks. CRC-32s are not recomputed (torch's
 * reader does not either): a STORED record is used as it is.
 *
 * The pickle goes through the restricted unpickler of io/formats/pickle.h
 * (weights_only semantics: nothing is executed; refused globals are named;
 * a whole pickled nn.Module gets "save model.state_dict() instead").
 *
 * The state dict is the top-level dict when its values are tensors; else,
 * a checkpoint dict, the dict under state_key when given
 * (model.weights_key), else under the first of "model", "state_dict",
 * "model_state_dict" that holds one (ch_pth_state_key says which).
 *
 * Each tensor: _rebuild_tensor_v2(storage, storage_offset, size, stride,
 * requires_grad, backward_hooks[, metadata]) (possibly inside
 * _rebuild_parameter). Checked: at most CH_ST_MAX_DIMS dims, sizes and
 * strides >= 0, and (storage_offset + sum((size_i - 1) x stride_i) + 1) x
 * element size <= the storage's bytes, the storage's declared numel x
 * element size <= its record's bytes, all with overflow checks (PyTorch's
 * own weights_only loader missed this check: CVE-2025-32434,
 * CVE-2026-24747). Strides and offsets are honoured. dtypes: float32 and
 * int64 kept; float16, bfloat16 and float64 converted to float32 (exact
 * for the first two; float64 rounds to nearest, as Tensor.float());
 * int32/int16/int8/uint8/bool tensors are refused naming the tensor. A
 * C-contiguous float32/int64 tensor is a view into the mapped file (no
 * copy); others are gathered/converted into memory the object owns, at
 * most 4 x the file's size + 64 MiB in all (CH_ERR_RANGE beyond: stride-0
 * views could otherwise make a small file allocate without bound).
 * Storages on other devices (location "cuda:0") are read as host data.
 */
#ifndef COHORT_IO_PTH_H
#define COHORT_IO_PTH_H

#include "framework/core/status.h"
#include "io/formats/safetensors.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What ch_pth_detect found. */
typedef enum { CH_PTH_NOT = 0, CH_PTH_ZIP = 1, CH_PTH_LEGACY = 2 } ch_pth_kind_t;

/* Decide by content from the first n bytes (n >= 16 suffices): a zip local
 * header "PK\3\4" (CH_PTH_ZIP), the legacy pickle of the magic number
 * (CH_PTH_LEGACY), else CH_PTH_NOT (e.g. a safetensors file). */
ch_pth_kind_t ch_pth_detect(const void *head, size_t n);

/* A loaded .pth state dict. */
typedef struct ch_pth ch_pth_t;

/* Open path (mapped read-only), find the state dict (state_key: NULL or ""
 * for the automatic choice above) and validate and convert every tensor of
 * it. Errors (every message starts with the path): CH_ERR_IO (cannot open),
 * CH_ERR_FORMAT (not a .pth, malformed zip or pickle, refused global or
 * opcode, a whole pickled model, a compressed record, a tensor outside its
 * storage, no state dict found: lists the top-level keys and names
 * model.weights_key), CH_ERR_UNSUPPORTED (big-endian file, a dtype other
 * than float32/16/64, bfloat16, int64), CH_ERR_RANGE (an unpickler limit),
 * CH_ERR_NOMEM. */
ch_status ch_pth_open(const char *path, const char *state_key, ch_pth_t **out);

/* Same from a buffer holding a whole file (not copied: it must stay valid
 * until ch_pth_destroy). label names it in messages. */
ch_status ch_pth_from_memory(const void *buf, size_t size, const char *label,
                             const char *state_key, ch_pth_t **out);

void ch_pth_destroy(ch_pth_t *p);

/* Tensors of the state dict in file (state-dict) order: views of dtype
 * CH_ST_F32 or CH_ST_I64, C-contiguous, data NOT necessarily aligned
 * (copy with memcpy). Valid until ch_pth_destroy. */
size_t ch_pth_count(const ch_pth_t *p);
const ch_st_view_t *ch_pth_at(const ch_pth_t *p, size_t i);
/* The tensor called name or NULL (O(log n)). */
const ch_st_view_t *ch_pth_find(const ch_pth_t *p, const char *name);

/* Where the state dict was found: "" for the top level, else the key of the
 * checkpoint dict ("model", "state_dict", ... or state_key). */
const char *ch_pth_state_key(const ch_pth_t *p);
/* CH_PTH_ZIP or CH_PTH_LEGACY. */
ch_pth_kind_t ch_pth_kind(const ch_pth_t *p);

/* Write views[0..n) (F32 / I64, C-contiguous host data) to path as a zip
 * .pth that torch.load(path, weights_only=True) reads and
 * load_state_dict(strict=True) takes: an OrderedDict of tensors in the
 * given order, one storage per tensor (float32 -> FloatStorage, int64 ->
 * LongStorage), records "archive/data.pkl", "archive/data/<i>",
 * "archive/version" ("3"), STORED and 64-byte aligned as torch writes them,
 * pickle protocol 2, and the state dict's `_metadata` attribute: one
 * entry per module prefix of the names ("" first, then pre-order), version
 * 2 for a module with running_mean (BatchNorm's _version), else 1 (modules
 * without tensors, e.g. relu, are absent: load_state_dict needs none).
 * Atomic (io/state/atomic_file.h): on error path is untouched. Errors:
 * CH_ERR_INVALID (a bad view, a duplicate name), CH_ERR_IO naming path,
 * CH_ERR_NOMEM. */
ch_status ch_pth_write(const char *path, const ch_st_view_t *views, size_t n);

/* One module of the state dict's `_metadata`: its dotted prefix ("" for the
 * root, "layer1.0.relu") and its class's _version (2 for BatchNorm, 1 for
 * the others). */
typedef struct {
    const char *prefix;
    int version;
} ch_pth_module_t;

/* ch_pth_write with `_metadata` exactly modules[0..n_modules), in that
 * order: every module of the model as torch.nn.Module.state_dict() visits
 * them (pre-order, parameterless ones such as ReLU included), which is what
 * torch writes. modules NULL: as ch_pth_write. Errors: as ch_pth_write,
 * CH_ERR_INVALID for a module without prefix. */
ch_status ch_pth_write_modules(const char *path, const ch_st_view_t *views, size_t n,
                               const ch_pth_module_t *modules, size_t n_modules);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_PTH_H */
