// C ABI between RocksDB (C++) and rocks-env (Rust).
//
// The shim wraps RocksDB's default FileSystem so every data call (reads,
// appends, syncs) and every metadata call (create, delete, rename) is handed
// to Rust before it happens, and installs an EventListener that tags the
// threads doing flushes and compactions. Rust decides the request context and
// enforces it through a kv-stage Stage; the shim never decides policy.

#ifndef ROCKS_ENV_SHIM_H
#define ROCKS_ENV_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "rocksdb/c.h"

#ifdef __cplusplus
extern "C" {
#endif

// What the listener says the calling thread is doing.
enum rocks_env_job_ctx {
  ROCKS_ENV_JOB_NONE = 0,
  ROCKS_ENV_JOB_FLUSH = 1,
  ROCKS_ENV_JOB_COMPACTION_L0 = 2,  // base input level 0 (L0->L1, intra-L0)
  ROCKS_ENV_JOB_COMPACTION_LN = 3,  // base input level >= 1
};

// Which file a request is for, from its name.
enum rocks_env_file_kind {
  ROCKS_ENV_FILE_OTHER = 0,  // CURRENT, OPTIONS, IDENTITY, LOCK, temp files
  ROCKS_ENV_FILE_WAL = 1,
  ROCKS_ENV_FILE_SST = 2,
  ROCKS_ENV_FILE_BLOB = 3,
  ROCKS_ENV_FILE_MANIFEST = 4,
  ROCKS_ENV_FILE_INFO_LOG = 5,
  ROCKS_ENV_FILE_DIR = 6,
};

// One request. `kind` uses kv-stage's RequestType discriminants
// (0 read, 1 write, 2 sync, 3 open, 4 close, 5 delete, 6 rename,
// 7 truncate, 8 metadata).
typedef struct rocks_env_request {
  uint64_t size;
  uint8_t kind;
  uint8_t file_kind;
  uint8_t io_activity;  // rocksdb::Env::IOActivity, 0xFF when unknown
  uint8_t job_ctx;      // rocks_env_job_ctx of the calling thread
} rocks_env_request;

// Flush and compaction jobs beginning and ending. Subcompactions only set
// the thread's job tag; the compaction they belong to is counted once.
enum rocks_env_event_kind {
  ROCKS_ENV_EVENT_FLUSH_BEGIN = 1,
  ROCKS_ENV_EVENT_FLUSH_COMPLETED = 2,
  ROCKS_ENV_EVENT_COMPACTION_BEGIN = 3,
  ROCKS_ENV_EVENT_COMPACTION_COMPLETED = 4,
};

typedef struct rocks_env_event {
  uint8_t kind;              // rocks_env_event_kind
  int32_t base_input_level;  // compactions; -1 for flushes
  uint64_t bytes_written;    // completed: SST bytes the job produced
  uint64_t bytes_read;       // completed compactions: input bytes
} rocks_env_event;

// Returns 0 to let the request go on; non-zero fails it with the message
// written (NUL-terminated, truncated) into `msg`.
typedef int32_t (*rocks_env_enforce_fn)(const void* handle,
                                        const rocks_env_request* req, char* msg,
                                        size_t msg_len);
typedef void (*rocks_env_event_fn)(const void* handle,
                                   const rocks_env_event* event);
// Drops one reference to `handle`.
typedef void (*rocks_env_release_fn)(const void* handle);

typedef struct rocks_env_callbacks {
  rocks_env_enforce_fn enforce;
  rocks_env_event_fn event;
  rocks_env_release_fn release;
} rocks_env_callbacks;

// A new Env whose FileSystem wraps FileSystem::Default(). Takes one
// reference to `handle` (released with `release` when the Env is destroyed
// through rocksdb_env_destroy). Never returns NULL.
rocksdb_env_t* rocks_env_create(const void* handle,
                                const rocks_env_callbacks* callbacks);

// Adds the tagging EventListener to `options`. Takes one reference to
// `handle`, released when the last copy of the options (and every DB opened
// with them) is gone.
void rocks_env_add_listener(rocksdb_options_t* options, const void* handle,
                            const rocks_env_callbacks* callbacks);

// Layout probes for the private rocksdb_options_t / rocksdb_env_t structs
// this shim repeats from db/c.cc. A test compares them with values set
// through the public C API; a mismatch means the layouts changed.
uint64_t rocks_env_probe_write_buffer_size(const rocksdb_options_t* options);
size_t rocks_env_probe_listener_count(const rocksdb_options_t* options);
int32_t rocks_env_probe_env_is_default(const rocksdb_env_t* env);
int32_t rocks_env_probe_env_is_ours(const rocksdb_env_t* env);

#ifdef __cplusplus
}
#endif

#endif  // ROCKS_ENV_SHIM_H
