// C ABI between RocksDB (C++) and rocks-env (Rust).
//
// The shim builds, per DB, a stack of FileSystem layers over the file system
// of the Env the application gave (RocksDB's default one when it gave
// none):
//
//   hook layer (the stage)  -> [hook layer (emulated device)]
//                           -> [fault layer (tests)] -> the application's FS
//
// A hook layer hands every data call (reads, appends, syncs) and every
// metadata call (open, close, delete, rename) to Rust before it happens, and
// fails the call with the message Rust returns. An Env over that stack
// reports the start and end of every background task the DB schedules, and
// an EventListener reports flushes, compactions and background errors. Rust
// decides what each request is and enforces it; the shim decides nothing.
//
// The numbers below are a wire format, decoded in rocks-env/src/wire.rs;
// a test there checks that this header and the Rust side agree.

#ifndef ROCKS_ENV_SHIM_H
#define ROCKS_ENV_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "rocksdb/c.h"

#ifdef __cplusplus
extern "C" {
#endif

// What a request does.
enum rocks_env_op {
  ROCKS_ENV_OP_READ = 0,
  ROCKS_ENV_OP_WRITE = 1,
  ROCKS_ENV_OP_SYNC = 2,        // Sync (fdatasync)
  ROCKS_ENV_OP_FSYNC = 3,       // Fsync, and a directory's fsync
  ROCKS_ENV_OP_RANGE_SYNC = 4,  // RangeSync (sync_file_range)
  ROCKS_ENV_OP_OPEN = 5,        // open or create a file or directory
  ROCKS_ENV_OP_CLOSE = 6,
  ROCKS_ENV_OP_DELETE = 7,
  ROCKS_ENV_OP_RENAME = 8,
  ROCKS_ENV_OP_TRUNCATE = 9,
  ROCKS_ENV_OP_LINK = 10,
  ROCKS_ENV_OP_PREFETCH = 11,  // readahead into the page cache (accounted)
  ROCKS_ENV_OP_ALLOCATE = 12,  // Allocate (fallocate) of a file's space
  ROCKS_ENV_OP_CREATE_DIR = 13,  // CreateDir, CreateDirIfMissing
  ROCKS_ENV_OP_LOCK = 14,        // LockFile, UnlockFile
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

// `io_activity` when the call carried no IOOptions.
#define ROCKS_ENV_ACTIVITY_UNKNOWN 0xFF

// One request.
typedef struct rocks_env_request {
  uint64_t size;
  uint8_t op;         // rocks_env_op
  uint8_t file_kind;  // rocks_env_file_kind
  // rocksdb::Env::IOActivity, or ROCKS_ENV_ACTIVITY_UNKNOWN
  uint8_t io_activity;
  // Out, set by the callback when it admits a read or a write (0 before
  // the call): when nonzero and smaller than `size`, the layer issues the
  // request to the file system below in pieces of at most this many bytes
  // (rounded up to the file's alignment), one after the other. Only reads
  // and positioned appends on files opened for direct I/O are split.
  uint64_t piece;
} rocks_env_request;

// What the listener and the Env report.
enum rocks_env_event_kind {
  ROCKS_ENV_EVENT_FLUSH_BEGIN = 1,
  ROCKS_ENV_EVENT_FLUSH_COMPLETED = 2,
  ROCKS_ENV_EVENT_COMPACTION_BEGIN = 3,
  ROCKS_ENV_EVENT_COMPACTION_COMPLETED = 4,
  ROCKS_ENV_EVENT_SUBCOMPACTION_BEGIN = 5,
  ROCKS_ENV_EVENT_SUBCOMPACTION_COMPLETED = 6,
  // A background task the DB scheduled (flush, compaction, purge, ...)
  // starts or ends on the calling thread.
  ROCKS_ENV_EVENT_TASK_BEGIN = 7,
  ROCKS_ENV_EVENT_TASK_END = 8,
  ROCKS_ENV_EVENT_BACKGROUND_ERROR = 9,
};

typedef struct rocks_env_event {
  uint8_t kind;              // rocks_env_event_kind
  uint8_t reason;            // FlushReason, CompactionReason or
                             // BackgroundErrorReason, by kind
  int32_t job_id;            // flushes and compactions
  int32_t base_input_level;  // compactions; -1 for flushes
  int32_t output_level;      // compactions; 0 for flushes
  uint64_t bytes_written;    // completed: bytes the job produced
  uint64_t bytes_read;       // completed compactions: input bytes
  const char* message;  // background errors: the status (valid during the call)
} rocks_env_event;

// What an enforce callback returns.
enum rocks_env_enforce_result {
  ROCKS_ENV_ENFORCE_OK = 0,         // the request goes on
  ROCKS_ENV_ENFORCE_REFUSED = 1,    // fails as an I/O error with `msg`
  ROCKS_ENV_ENFORCE_PANIC = 2,      // the callback failed; an I/O error
  ROCKS_ENV_ENFORCE_SHUT_DOWN = 3,  // the stage is shut down
};

// Returns a rocks_env_enforce_result; on failure the message is written
// (NUL-terminated, truncated) into `msg`.
typedef int32_t (*rocks_env_enforce_fn)(const void* handle,
                                        rocks_env_request* req, char* msg,
                                        size_t msg_len);
typedef void (*rocks_env_event_fn)(const void* handle,
                                   const rocks_env_event* event);
// Drops one reference to `handle`.
typedef void (*rocks_env_release_fn)(const void* handle);
// Asked for a table, blob or WAL file the DB deletes (`waited_ms` 0), and
// then every 50 ms for the oldest file that waits (`waited_ms`: since its
// deletion was asked): nonzero to hold the deletion back, 0 to delete now.
// A file held back is renamed to its name plus ROCKS_ENV_DEFERRED_SUFFIX at
// once and unlinked later by the layer's own thread, one file at a time;
// what still waits when the layer is destroyed is unlinked then.
typedef int32_t (*rocks_env_defer_delete_fn)(const void* handle,
                                             uint8_t file_kind,
                                             uint64_t waited_ms);

// Bytes the layer's thread frees at a time when it deletes a file (0: the
// whole file at once). Nonzero, every table, blob or WAL file the DB deletes
// goes to that thread (renamed as when held back), which shortens it by this
// many bytes, waits ROCKS_ENV_DELETE_PIECE_PAUSE_MS, and so on, then unlinks
// it: on a file system with online discard, each piece is one bounded
// discard rather than one for the whole file. Asked once per file.
typedef uint64_t (*rocks_env_delete_piece_fn)(const void* handle);

// The pause between two pieces of a deletion (rocks_env_delete_piece_fn).
#define ROCKS_ENV_DELETE_PIECE_PAUSE_MS 10

typedef struct rocks_env_callbacks {
  rocks_env_enforce_fn enforce;
  rocks_env_event_fn event;
  rocks_env_release_fn release;
  rocks_env_defer_delete_fn defer_delete;
  rocks_env_delete_piece_fn delete_piece;
} rocks_env_callbacks;

// What a deletion held back is renamed to: its name plus this.
#define ROCKS_ENV_DEFERRED_SUFFIX ".rocks-env-deferred"

// A file system layer (a shared reference to a rocksdb::FileSystem).
typedef struct rocks_env_fs_t rocks_env_fs_t;

// The file system of the Env `options` carry (the default Env's when the
// application set none). Writes 1 into `*is_staged` when that file system
// is already a hook layer of this shim.
rocks_env_fs_t* rocks_env_fs_of_options(const rocksdb_options_t* options,
                                        int32_t* is_staged);

// A hook layer over `below`. Takes one reference to `handle`, released with
// `release` when the layer is destroyed.
rocks_env_fs_t* rocks_env_fs_hook(const rocks_env_fs_t* below,
                                  const void* handle,
                                  const rocks_env_callbacks* callbacks);

void rocks_env_fs_destroy(rocks_env_fs_t* fs);

// A new Env whose file system is `fs` and whose threads, clock and task
// scheduling are those of the Env `options` carry; every task it schedules
// is reported to `handle` (TASK_BEGIN / TASK_END). Takes one reference to
// `handle`. Destroy it with rocksdb_env_destroy. Never returns NULL.
rocksdb_env_t* rocks_env_create(const rocksdb_options_t* options,
                                const rocks_env_fs_t* fs, const void* handle,
                                const rocks_env_callbacks* callbacks);

// Adds the reporting EventListener to `options`. Takes one reference to
// `handle`, released when the last copy of the options (and every DB opened
// with them) is gone.
void rocks_env_add_listener(rocksdb_options_t* options, const void* handle,
                            const rocks_env_callbacks* callbacks);

// ---- fault injection (tests) ---------------------------------------------

typedef struct rocks_env_fault_t rocks_env_fault_t;

// Fails matching operations: `ops` is a mask of (1 << rocks_env_op),
// `files` of (1 << rocks_env_file_kind) (0: any file), `activity` an
// IOActivity value (-1: any). The first `skip` matching operations pass;
// the next `count` fail (UINT64_MAX: all of them).
typedef struct rocks_env_fault_rule {
  uint32_t ops;
  uint32_t files;
  int32_t activity;
  uint64_t skip;
  uint64_t count;
} rocks_env_fault_rule;

typedef struct rocks_env_fault_report {
  uint64_t files_truncated;
  uint64_t bytes_dropped;
  uint64_t files_removed;
  uint64_t renames_undone;
} rocks_env_fault_report;

rocks_env_fault_t* rocks_env_fault_new(void);
void rocks_env_fault_free(rocks_env_fault_t* fault);
// Replaces the rule (NULL: no rule).
void rocks_env_fault_set_rule(rocks_env_fault_t* fault,
                              const rocks_env_fault_rule* rule);
uint64_t rocks_env_fault_injected(const rocks_env_fault_t* fault);
// From now on every operation fails.
void rocks_env_fault_power_cut(rocks_env_fault_t* fault);
// Drops what a power cut loses (see fault.cc) and lets operations through
// again; 0 on success, else non-zero with a message in `msg`.
int32_t rocks_env_fault_recover(rocks_env_fault_t* fault,
                                rocks_env_fault_report* report, char* msg,
                                size_t msg_len);
// A fault layer over `below`.
rocks_env_fs_t* rocks_env_fs_fault(const rocks_env_fs_t* below,
                                   const rocks_env_fault_t* fault);

// ---- layout probes ---------------------------------------------------------

// Read the private rocksdb_options_t / rocksdb_env_t structs this shim
// repeats from db/c.cc. A test compares them with values set through the
// public C API; a mismatch means the layouts changed.
uint64_t rocks_env_probe_write_buffer_size(const rocksdb_options_t* options);
size_t rocks_env_probe_listener_count(const rocksdb_options_t* options);
int32_t rocks_env_probe_env_is_default(const rocksdb_env_t* env);
int32_t rocks_env_probe_env_is_ours(const rocksdb_env_t* env);

#ifdef __cplusplus
}
#endif

#endif  // ROCKS_ENV_SHIM_H
