// RocksDB side of rocks-env: a FileSystem layer that hands every request to
// Rust before it happens, an Env that reports the background tasks a DB
// schedules, and an EventListener that reports flushes, compactions and
// background errors. See shim.h for the C ABI.

#include "shim.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "env/composite_env_wrapper.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "shim_internal.h"

// The compaction reason travels as RocksDB's CompactionReason number;
// kv_stage::Reason::from_rocksdb maps it by this order (Reason = number + 1).
// A RocksDB that reorders or extends the enum fails to build here.
using CR = rocksdb::CompactionReason;
static_assert(static_cast<int>(CR::kUnknown) == 0);
static_assert(static_cast<int>(CR::kLevelL0FilesNum) == 1);
static_assert(static_cast<int>(CR::kLevelMaxLevelSize) == 2);
static_assert(static_cast<int>(CR::kUniversalSizeAmplification) == 3);
static_assert(static_cast<int>(CR::kUniversalSizeRatio) == 4);
static_assert(static_cast<int>(CR::kUniversalSortedRunNum) == 5);
static_assert(static_cast<int>(CR::kFIFOMaxSize) == 6);
static_assert(static_cast<int>(CR::kFIFOReduceNumFiles) == 7);
static_assert(static_cast<int>(CR::kFIFOTtl) == 8);
static_assert(static_cast<int>(CR::kManualCompaction) == 9);
static_assert(static_cast<int>(CR::kFilesMarkedForCompaction) == 10);
static_assert(static_cast<int>(CR::kBottommostFiles) == 11);
static_assert(static_cast<int>(CR::kTtl) == 12);
static_assert(static_cast<int>(CR::kFlush) == 13);
static_assert(static_cast<int>(CR::kExternalSstIngestion) == 14);
static_assert(static_cast<int>(CR::kPeriodicCompaction) == 15);
static_assert(static_cast<int>(CR::kChangeTemperature) == 16);
static_assert(static_cast<int>(CR::kForcedBlobGC) == 17);
static_assert(static_cast<int>(CR::kRoundRobinTtl) == 18);
static_assert(static_cast<int>(CR::kRefitLevel) == 19);
static_assert(static_cast<int>(CR::kReadTriggered) == 20);
static_assert(static_cast<int>(CR::kNumOfReasons) == 21);

// Private layouts repeated from RocksDB's db/c.cc (11.8.1). The C API hands
// out pointers to these; building our own Env and reaching an Options' C++
// object needs them. `rocks_env_probe_*` and the layout test in
// rocks-env/tests/layout.rs fail loudly if a version bump changes them.
struct rocksdb_env_t {
  rocksdb::Env* rep;
  bool is_default;
};
struct rocksdb_options_t {
  rocksdb::Options rep;
};

namespace {

using rocksdb::DataVerificationInfo;
using rocksdb::DirFsyncOptions;
using rocksdb::FileOptions;
using rocksdb::FileSystem;
using rocksdb::FileSystemWrapper;
using rocksdb::FSDirectory;
using rocksdb::FSDirectoryWrapper;
using rocksdb::FSRandomAccessFile;
using rocksdb::FSRandomAccessFileOwnerWrapper;
using rocksdb::FSRandomRWFile;
using rocksdb::FSRandomRWFileOwnerWrapper;
using rocksdb::FSReadRequest;
using rocksdb::FSSequentialFile;
using rocksdb::FSSequentialFileOwnerWrapper;
using rocksdb::FSWritableFile;
using rocksdb::FSWritableFileOwnerWrapper;
using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

using rocks_env::FileKindOf;

constexpr uint8_t kRead = ROCKS_ENV_OP_READ;
constexpr uint8_t kWrite = ROCKS_ENV_OP_WRITE;
constexpr uint8_t kSync = ROCKS_ENV_OP_SYNC;
constexpr uint8_t kFsync = ROCKS_ENV_OP_FSYNC;
constexpr uint8_t kRangeSync = ROCKS_ENV_OP_RANGE_SYNC;
constexpr uint8_t kOpen = ROCKS_ENV_OP_OPEN;
constexpr uint8_t kClose = ROCKS_ENV_OP_CLOSE;
constexpr uint8_t kDelete = ROCKS_ENV_OP_DELETE;
constexpr uint8_t kRename = ROCKS_ENV_OP_RENAME;
constexpr uint8_t kTruncate = ROCKS_ENV_OP_TRUNCATE;
constexpr uint8_t kLink = ROCKS_ENV_OP_LINK;
constexpr uint8_t kPrefetch = ROCKS_ENV_OP_PREFETCH;
constexpr uint8_t kAllocate = ROCKS_ENV_OP_ALLOCATE;
constexpr uint8_t kCreateDir = ROCKS_ENV_OP_CREATE_DIR;
constexpr uint8_t kLock = ROCKS_ENV_OP_LOCK;

// The Rust handle plus its callbacks; the last owner releases the handle.
class Handle {
 public:
  Handle(const void* handle, const rocks_env_callbacks& cbs)
      : handle_(handle), cbs_(cbs) {}
  ~Handle() { cbs_.release(handle_); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  // `piece`, when given, receives the size of the pieces the admitted
  // request is to be issued in (0: whole).
  IOStatus Enforce(uint8_t op, uint8_t file_kind, uint64_t size,
                   const IOOptions* opts, uint64_t* piece = nullptr) const {
    rocks_env_request req;
    req.size = size;
    req.op = op;
    req.file_kind = file_kind;
    req.io_activity = opts != nullptr ? static_cast<uint8_t>(opts->io_activity)
                                      : ROCKS_ENV_ACTIVITY_UNKNOWN;
    req.piece = 0;
    char msg[256];
    msg[0] = '\0';
    int32_t rc = cbs_.enforce(handle_, &req, msg, sizeof(msg));
    if (rc == ROCKS_ENV_ENFORCE_OK) {
      if (piece != nullptr) *piece = req.piece;
      return IOStatus::OK();
    }
    msg[sizeof(msg) - 1] = '\0';
    if (rc == ROCKS_ENV_ENFORCE_SHUT_DOWN) {
      // The stage is gone: to RocksDB this is a shutdown, not a device
      // error (no background error, no retry after a pause).
      return rocksdb::status_to_io_status(
          rocksdb::Status::ShutdownInProgress("kv-stage", msg));
    }
    return IOStatus::IOError("kv-stage refused the request", msg);
  }

  void Emit(const rocks_env_event& ev) const { cbs_.event(handle_, &ev); }

  // Whether to hold back the deletion of a file of `file_kind` that has
  // waited `waited_ms` (see rocks_env_defer_delete_fn).
  bool DeferDelete(uint8_t file_kind, uint64_t waited_ms) const {
    return cbs_.defer_delete(handle_, file_kind, waited_ms) != 0;
  }

  // Bytes to free at a time when the layer's thread deletes a file (see
  // rocks_env_delete_piece_fn).
  uint64_t DeletePiece() const { return cbs_.delete_piece(handle_); }

  void Emit(uint8_t kind) const {
    rocks_env_event ev{};
    ev.kind = kind;
    Emit(ev);
  }

 private:
  const void* handle_;
  rocks_env_callbacks cbs_;
};

// Enforces a request and, if it is admitted, makes the call: the pattern
// every wrapped method follows.
template <typename Call>
IOStatus Guarded(const Handle& h, uint8_t op, uint8_t file_kind, uint64_t size,
                 const IOOptions& options, Call call) {
  IOStatus s = h.Enforce(op, file_kind, size, &options);
  return s.ok() ? call() : s;
}

// The size of the pieces to issue a request of `n` bytes at `offset` in,
// or 0 to issue it whole: the handle asked for pieces smaller than the
// request, the file does direct I/O (where a request reaches the device as
// issued) and the request is aligned as direct I/O requires. A piece is
// rounded up to the alignment, so that every piece but the last is aligned
// in offset, length and buffer.
size_t PieceSize(uint64_t piece, uint64_t offset, size_t n, bool direct,
                 size_t alignment) {
  if (piece == 0 || !direct || n <= piece) return 0;
  if (alignment == 0) alignment = 1;
  if (offset % alignment != 0) return 0;
  uint64_t rounded = (piece + alignment - 1) / alignment * alignment;
  return rounded < n ? static_cast<size_t>(rounded) : 0;
}

}  // namespace

uint8_t rocks_env::FileKindOf(std::string_view path) {
  size_t slash = path.find_last_of('/');
  std::string_view name =
      slash == std::string_view::npos ? path : path.substr(slash + 1);
  if (name.ends_with(".log")) return ROCKS_ENV_FILE_WAL;
  if (name.ends_with(".sst")) return ROCKS_ENV_FILE_SST;
  if (name.ends_with(".blob")) return ROCKS_ENV_FILE_BLOB;
  if (name.starts_with("MANIFEST-")) return ROCKS_ENV_FILE_MANIFEST;
  if (name == "LOG" || name.starts_with("LOG.old.")) {
    return ROCKS_ENV_FILE_INFO_LOG;
  }
  return ROCKS_ENV_FILE_OTHER;
}

namespace {

class StagedSequentialFile : public FSSequentialFileOwnerWrapper {
 public:
  StagedSequentialFile(std::unique_ptr<FSSequentialFile>&& t,
                       std::shared_ptr<const Handle> h, uint8_t file_kind)
      : FSSequentialFileOwnerWrapper(std::move(t)),
        h_(std::move(h)),
        file_kind_(file_kind) {}

  IOStatus Read(size_t n, const IOOptions& options, Slice* result,
                char* scratch, IODebugContext* dbg) override {
    return Guarded(*h_, kRead, file_kind_, n, options, [&] {
      return FSSequentialFileOwnerWrapper::Read(n, options, result, scratch,
                                                dbg);
    });
  }

  IOStatus PositionedRead(uint64_t offset, size_t n, const IOOptions& options,
                          Slice* result, char* scratch,
                          IODebugContext* dbg) override {
    return Guarded(*h_, kRead, file_kind_, n, options, [&] {
      return FSSequentialFileOwnerWrapper::PositionedRead(offset, n, options,
                                                          result, scratch, dbg);
    });
  }

 private:
  std::shared_ptr<const Handle> h_;
  uint8_t file_kind_;
};

class StagedRandomAccessFile : public FSRandomAccessFileOwnerWrapper {
 public:
  StagedRandomAccessFile(std::unique_ptr<FSRandomAccessFile>&& t,
                         std::shared_ptr<const Handle> h, uint8_t file_kind)
      : FSRandomAccessFileOwnerWrapper(std::move(t)),
        h_(std::move(h)),
        file_kind_(file_kind) {}

  // A large read the handle asks to split (a flush's or a compaction's, on
  // a direct-I/O file) is read piece by piece into `scratch`, so that a
  // client's read queued at the device waits behind one piece, not the
  // whole request. It is enforced and counted once, whole.
  IOStatus Read(uint64_t offset, size_t n, const IOOptions& options,
                Slice* result, char* scratch,
                IODebugContext* dbg) const override {
    uint64_t asked = 0;
    IOStatus s = h_->Enforce(kRead, file_kind_, n, &options, &asked);
    if (!s.ok()) return s;
    size_t piece =
        scratch == nullptr
            ? 0
            : PieceSize(asked, offset, n, use_direct_io(),
                        GetRequiredBufferAlignment());
    if (piece == 0) {
      return FSRandomAccessFileOwnerWrapper::Read(offset, n, options, result,
                                                  scratch, dbg);
    }
    size_t done = 0;
    while (done < n) {
      size_t len = std::min(piece, n - done);
      Slice part;
      s = FSRandomAccessFileOwnerWrapper::Read(offset + done, len, options,
                                               &part, scratch + done, dbg);
      if (!s.ok()) return s;
      if (part.size() > 0 && part.data() != scratch + done) {
        std::memmove(scratch + done, part.data(), part.size());
      }
      done += part.size();
      if (part.size() < len) break;  // the end of the file
    }
    *result = Slice(scratch, done);
    return s;
  }

  IOStatus MultiRead(FSReadRequest* reqs, size_t num_reqs,
                     const IOOptions& options, IODebugContext* dbg) override {
    uint64_t total = 0;
    for (size_t i = 0; i < num_reqs; ++i) total += reqs[i].len;
    IOStatus s = h_->Enforce(kRead, file_kind_, total, &options);
    if (!s.ok()) {
      for (size_t i = 0; i < num_reqs; ++i) reqs[i].status = s;
      return s;
    }
    return FSRandomAccessFileOwnerWrapper::MultiRead(reqs, num_reqs, options,
                                                     dbg);
  }

  IOStatus ReadAsync(FSReadRequest& req, const IOOptions& opts,
                     std::function<void(FSReadRequest&, void*)> cb,
                     void* cb_arg, void** io_handle,
                     rocksdb::IOHandleDeleter* del_fn,
                     IODebugContext* dbg) override {
    return Guarded(*h_, kRead, file_kind_, req.len, opts, [&] {
      return FSRandomAccessFileOwnerWrapper::ReadAsync(req, opts, cb, cb_arg,
                                                       io_handle, del_fn, dbg);
    });
  }

  // Readahead into the page cache. The Reads that then take the data from
  // the cache are enforced and charged with the job's context; charging the
  // readahead too would count those bytes twice. Rust accounts it per file
  // kind and never holds or refuses it.
  IOStatus Prefetch(uint64_t offset, size_t n, const IOOptions& options,
                    IODebugContext* dbg) override {
    return Guarded(*h_, kPrefetch, file_kind_, n, options, [&] {
      return FSRandomAccessFileOwnerWrapper::Prefetch(offset, n, options, dbg);
    });
  }

  // The base class reads synchronously through Read (enforced above), so
  // nothing is read past the stage; the target's own async path is skipped.
  bool SubmitReadAsync(FSReadRequest& req, const IOOptions& opts,
                       std::function<void(FSReadRequest&)> cb,
                       IODebugContext* dbg) override {
    return FSRandomAccessFile::SubmitReadAsync(req, opts, std::move(cb), dbg);
  }

 private:
  std::shared_ptr<const Handle> h_;
  uint8_t file_kind_;
};

// What the wrapped files that write share: the handle, the file kind, and
// enforced Sync, Fsync and Close. `Base` is the RocksDB owner-wrapper.
template <typename Base>
class StagedWriting : public Base {
 public:
  template <typename File>
  StagedWriting(std::unique_ptr<File>&& t, std::shared_ptr<const Handle> h,
                uint8_t file_kind)
      : Base(std::move(t)), h_(std::move(h)), file_kind_(file_kind) {}

  IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
    return Guarded(*h_, kSync, file_kind_, 0, options,
                   [&] { return Base::Sync(options, dbg); });
  }

  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    return Guarded(*h_, kFsync, file_kind_, 0, options,
                   [&] { return Base::Fsync(options, dbg); });
  }

  IOStatus Close(const IOOptions& options, IODebugContext* dbg) override {
    return Guarded(*h_, kClose, file_kind_, 0, options,
                   [&] { return Base::Close(options, dbg); });
  }

 protected:
  std::shared_ptr<const Handle> h_;
  uint8_t file_kind_;
};

class StagedWritableFile : public StagedWriting<FSWritableFileOwnerWrapper> {
 public:
  using StagedWriting::StagedWriting;
  using Base = FSWritableFileOwnerWrapper;

  IOStatus Append(const Slice& data, const IOOptions& options,
                  IODebugContext* dbg) override {
    return Guarded(*h_, kWrite, file_kind_, data.size(), options,
                   [&] { return Base::Append(data, options, dbg); });
  }

  IOStatus Append(const Slice& data, const IOOptions& options,
                  const DataVerificationInfo& info,
                  IODebugContext* dbg) override {
    return Guarded(*h_, kWrite, file_kind_, data.size(), options,
                   [&] { return Base::Append(data, options, info, dbg); });
  }

  // Direct-I/O writes of flushes and compactions go through here; one the
  // handle asks to split is written piece by piece, in order (see Read of
  // the random-access file). The overload with verification info is never
  // split: its checksum covers the whole buffer.
  IOStatus PositionedAppend(const Slice& data, uint64_t offset,
                            const IOOptions& options,
                            IODebugContext* dbg) override {
    uint64_t asked = 0;
    IOStatus s = h_->Enforce(kWrite, file_kind_, data.size(), &options, &asked);
    if (!s.ok()) return s;
    size_t piece = PieceSize(asked, offset, data.size(), use_direct_io(),
                             GetRequiredBufferAlignment());
    if (piece == 0) return Base::PositionedAppend(data, offset, options, dbg);
    for (size_t done = 0; done < data.size() && s.ok(); done += piece) {
      size_t len = std::min(piece, data.size() - done);
      s = Base::PositionedAppend(Slice(data.data() + done, len), offset + done,
                                 options, dbg);
    }
    return s;
  }

  IOStatus PositionedAppend(const Slice& data, uint64_t offset,
                            const IOOptions& options,
                            const DataVerificationInfo& info,
                            IODebugContext* dbg) override {
    return Guarded(*h_, kWrite, file_kind_, data.size(), options, [&] {
      return Base::PositionedAppend(data, offset, options, info, dbg);
    });
  }

  IOStatus Truncate(uint64_t size, const IOOptions& options,
                    IODebugContext* dbg) override {
    return Guarded(*h_, kTruncate, file_kind_, 0, options,
                   [&] { return Base::Truncate(size, options, dbg); });
  }

  IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const IOOptions& options,
                     IODebugContext* dbg) override {
    return Guarded(*h_, kRangeSync, file_kind_, 0, options, [&] {
      return Base::RangeSync(offset, nbytes, options, dbg);
    });
  }

  IOStatus Allocate(uint64_t offset, uint64_t len, const IOOptions& options,
                    IODebugContext* dbg) override {
    return Guarded(*h_, kAllocate, file_kind_, 0, options,
                   [&] { return Base::Allocate(offset, len, options, dbg); });
  }

  // Preallocation is decided here, by FSWritableFile's own logic, so that
  // the Allocate it calls is the enforced one above (the owner wrapper
  // would hand PrepareWrite to the target, whose Allocate is not).
  void SetPreallocationBlockSize(size_t size) override {
    FSWritableFile::SetPreallocationBlockSize(size);
    Base::SetPreallocationBlockSize(size);
  }

  void GetPreallocationStatus(size_t* block_size,
                              size_t* last_allocated_block) override {
    FSWritableFile::GetPreallocationStatus(block_size, last_allocated_block);
  }

  void PrepareWrite(size_t offset, size_t len, const IOOptions& options,
                    IODebugContext* dbg) override {
    FSWritableFile::PrepareWrite(offset, len, options, dbg);
  }
};

class StagedRandomRWFile : public StagedWriting<FSRandomRWFileOwnerWrapper> {
 public:
  using StagedWriting::StagedWriting;
  using Base = FSRandomRWFileOwnerWrapper;

  IOStatus Write(uint64_t offset, const Slice& data, const IOOptions& options,
                 IODebugContext* dbg) override {
    return Guarded(*h_, kWrite, file_kind_, data.size(), options,
                   [&] { return Base::Write(offset, data, options, dbg); });
  }

  IOStatus Read(uint64_t offset, size_t n, const IOOptions& options,
                Slice* result, char* scratch,
                IODebugContext* dbg) const override {
    return Guarded(*h_, kRead, file_kind_, n, options, [&] {
      return Base::Read(offset, n, options, result, scratch, dbg);
    });
  }
};

class StagedDirectory : public FSDirectoryWrapper {
 public:
  StagedDirectory(std::unique_ptr<FSDirectory>&& t,
                  std::shared_ptr<const Handle> h)
      : FSDirectoryWrapper(std::move(t)), h_(std::move(h)) {}

  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    return Guarded(*h_, kFsync, ROCKS_ENV_FILE_DIR, 0, options,
                   [&] { return FSDirectoryWrapper::Fsync(options, dbg); });
  }

  IOStatus FsyncWithDirOptions(const IOOptions& options, IODebugContext* dbg,
                               const DirFsyncOptions& dir_opts) override {
    return Guarded(*h_, kFsync, ROCKS_ENV_FILE_DIR, 0, options, [&] {
      return FSDirectoryWrapper::FsyncWithDirOptions(options, dbg, dir_opts);
    });
  }

 private:
  std::shared_ptr<const Handle> h_;
};

class HookFileSystem : public FileSystemWrapper {
 public:
  HookFileSystem(const std::shared_ptr<FileSystem>& base,
                 std::shared_ptr<const Handle> h)
      : FileSystemWrapper(base), h_(std::move(h)) {}

  // Deletions still held back are done now, on the destroying thread.
  ~HookFileSystem() override {
    {
      std::lock_guard<std::mutex> l(deferred_mu_);
      stop_ = true;
    }
    deferred_cv_.notify_all();
    if (deleter_.joinable()) deleter_.join();
    IOOptions io;
    for (const Deferred& d : deferred_) {
      target()->DeleteFile(d.name, io, nullptr).PermitUncheckedError();
    }
  }

  static const char* kClassName() { return "KvStageFileSystem"; }
  const char* Name() const override { return kClassName(); }

  IOStatus NewSequentialFile(const std::string& f, const FileOptions& o,
                             std::unique_ptr<FSSequentialFile>* r,
                             IODebugContext* dbg) override {
    return Open<StagedSequentialFile>(f, o, r, [&](auto* file) {
      return target()->NewSequentialFile(f, o, file, dbg);
    });
  }

  IOStatus NewRandomAccessFile(const std::string& f, const FileOptions& o,
                               std::unique_ptr<FSRandomAccessFile>* r,
                               IODebugContext* dbg) override {
    return Open<StagedRandomAccessFile>(f, o, r, [&](auto* file) {
      return target()->NewRandomAccessFile(f, o, file, dbg);
    });
  }

  IOStatus NewWritableFile(const std::string& f, const FileOptions& o,
                           std::unique_ptr<FSWritableFile>* r,
                           IODebugContext* dbg) override {
    return Open<StagedWritableFile>(f, o, r, [&](auto* file) {
      return target()->NewWritableFile(f, o, file, dbg);
    });
  }

  IOStatus ReopenWritableFile(const std::string& f, const FileOptions& o,
                              std::unique_ptr<FSWritableFile>* r,
                              IODebugContext* dbg) override {
    return Open<StagedWritableFile>(f, o, r, [&](auto* file) {
      return target()->ReopenWritableFile(f, o, file, dbg);
    });
  }

  IOStatus ReuseWritableFile(const std::string& f, const std::string& old_f,
                             const FileOptions& o,
                             std::unique_ptr<FSWritableFile>* r,
                             IODebugContext* dbg) override {
    return Open<StagedWritableFile>(f, o, r, [&](auto* file) {
      return target()->ReuseWritableFile(f, old_f, o, file, dbg);
    });
  }

  IOStatus NewRandomRWFile(const std::string& f, const FileOptions& o,
                           std::unique_ptr<FSRandomRWFile>* r,
                           IODebugContext* dbg) override {
    return Open<StagedRandomRWFile>(f, o, r, [&](auto* file) {
      return target()->NewRandomRWFile(f, o, file, dbg);
    });
  }

  IOStatus NewDirectory(const std::string& name, const IOOptions& io_opts,
                        std::unique_ptr<FSDirectory>* r,
                        IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kOpen, ROCKS_ENV_FILE_DIR, 0, &io_opts);
    if (!s.ok()) return s;
    std::unique_ptr<FSDirectory> dir;
    s = target()->NewDirectory(name, io_opts, &dir, dbg);
    if (s.ok()) r->reset(new StagedDirectory(std::move(dir), h_));
    return s;
  }

  // A table, blob or WAL file whose deletion the handle holds back is
  // renamed (a metadata change; freeing its blocks, which on a file system
  // with online discard sends the device a discard, is what waits) and
  // unlinked later by this layer's thread.
  IOStatus DeleteFile(const std::string& f, const IOOptions& options,
                      IODebugContext* dbg) override {
    const uint8_t kind = FileKindOf(f);
    IOStatus s = h_->Enforce(kDelete, kind, 0, &options);
    if (!s.ok()) return s;
    const bool deferrable = kind == ROCKS_ENV_FILE_SST ||
                            kind == ROCKS_ENV_FILE_BLOB ||
                            kind == ROCKS_ENV_FILE_WAL;
    // In pieces, every such deletion is the layer thread's; held back or
    // not, the caller does not wait for the device.
    if (deferrable && (h_->DeferDelete(kind, 0) || h_->DeletePiece() > 0)) {
      std::string held = f + ROCKS_ENV_DEFERRED_SUFFIX;
      if (target()->RenameFile(f, held, options, dbg).ok()) {
        Hold(std::move(held), kind);
        return IOStatus::OK();
      }
    }
    return target()->DeleteFile(f, options, dbg);
  }

  IOStatus Truncate(const std::string& f, size_t size, const IOOptions& options,
                    IODebugContext* dbg) override {
    return Guarded(*h_, kTruncate, FileKindOf(f), 0, options,
                   [&] { return target()->Truncate(f, size, options, dbg); });
  }

  IOStatus DeleteDir(const std::string& d, const IOOptions& options,
                     IODebugContext* dbg) override {
    return Guarded(*h_, kDelete, ROCKS_ENV_FILE_DIR, 0, options,
                   [&] { return target()->DeleteDir(d, options, dbg); });
  }

  IOStatus RenameFile(const std::string& src, const std::string& dst,
                      const IOOptions& options, IODebugContext* dbg) override {
    return Guarded(*h_, kRename, FileKindOf(dst), 0, options, [&] {
      return target()->RenameFile(src, dst, options, dbg);
    });
  }

  IOStatus LinkFile(const std::string& src, const std::string& dst,
                    const IOOptions& options, IODebugContext* dbg) override {
    return Guarded(*h_, kLink, FileKindOf(dst), 0, options,
                   [&] { return target()->LinkFile(src, dst, options, dbg); });
  }

  // A sync by name (SST ingestion with move or link, among others).
  IOStatus SyncFile(const std::string& f, const FileOptions& file_opts,
                    const IOOptions& io_opts, bool use_fsync,
                    IODebugContext* dbg) override {
    return Guarded(*h_, use_fsync ? kFsync : kSync, FileKindOf(f), 0, io_opts,
                   [&] {
                     return target()->SyncFile(f, file_opts, io_opts,
                                               use_fsync, dbg);
                   });
  }

  IOStatus CreateDir(const std::string& d, const IOOptions& options,
                     IODebugContext* dbg) override {
    return Guarded(*h_, kCreateDir, ROCKS_ENV_FILE_DIR, 0, options,
                   [&] { return target()->CreateDir(d, options, dbg); });
  }

  IOStatus CreateDirIfMissing(const std::string& d, const IOOptions& options,
                              IODebugContext* dbg) override {
    return Guarded(*h_, kCreateDir, ROCKS_ENV_FILE_DIR, 0, options, [&] {
      return target()->CreateDirIfMissing(d, options, dbg);
    });
  }

  IOStatus LockFile(const std::string& f, const IOOptions& options,
                    rocksdb::FileLock** l, IODebugContext* dbg) override {
    return Guarded(*h_, kLock, FileKindOf(f), 0, options,
                   [&] { return target()->LockFile(f, options, l, dbg); });
  }

  IOStatus UnlockFile(rocksdb::FileLock* l, const IOOptions& options,
                      IODebugContext* dbg) override {
    // Never refused: a lock must be released whatever the stage says (a
    // DB that cannot unlock cannot be opened again by this process).
    IOStatus s = h_->Enforce(kLock, ROCKS_ENV_FILE_OTHER, 0, &options);
    s.PermitUncheckedError();
    return target()->UnlockFile(l, options, dbg);
  }

  // The base implementation opens the info log with our NewWritableFile, so
  // its bytes go through the stage too (the wrapper's default would open it
  // on the target file system directly).
  IOStatus NewLogger(const std::string& fname, const IOOptions& options,
                     std::shared_ptr<rocksdb::Logger>* result,
                     IODebugContext* dbg) override {
    return FileSystem::NewLogger(fname, options, result, dbg);
  }

 private:
  // Enforces the open of `f` as a metadata request, opens it on the target
  // with `open`, and wraps the result so its data calls are enforced too.
  template <typename Staged, typename File, typename OpenFn>
  IOStatus Open(const std::string& f, const FileOptions& o,
                std::unique_ptr<File>* r, OpenFn open) {
    uint8_t file_kind = FileKindOf(f);
    IOStatus s = h_->Enforce(kOpen, file_kind, 0, &o.io_options);
    if (!s.ok()) return s;
    std::unique_ptr<File> file;
    s = open(&file);
    if (s.ok()) r->reset(new Staged(std::move(file), h_, file_kind));
    return s;
  }

  struct Deferred {
    std::string name;
    uint8_t kind;
    std::chrono::steady_clock::time_point since;
  };

  void Hold(std::string name, uint8_t kind) {
    std::lock_guard<std::mutex> l(deferred_mu_);
    deferred_.push_back({std::move(name), kind, std::chrono::steady_clock::now()});
    if (!deleter_.joinable()) deleter_ = std::thread([this] { DeleterLoop(); });
  }

  // Every 50 ms, asks whether the oldest held-back file may go, and
  // unlinks it (outside the lock) when it may: one file at a time.
  void DeleterLoop() {
    std::unique_lock<std::mutex> l(deferred_mu_);
    while (!stop_) {
      deferred_cv_.wait_for(l, std::chrono::milliseconds(50));
      if (stop_ || deferred_.empty()) continue;
      const Deferred front = deferred_.front();
      l.unlock();
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - front.since);
      const bool hold = h_->DeferDelete(front.kind, static_cast<uint64_t>(waited.count()));
      const bool done = !hold && Release(front.name);
      l.lock();
      // Only this thread removes entries, so the front is still `front`.
      if (done) deferred_.pop_front();
    }
  }

  // Unlinks `name`, first freeing its blocks DeletePiece() bytes at a time
  // from its end with a pause between pieces. False when the layer began to
  // close before the file was gone (the destructor unlinks it then). A
  // failed shortening only ends the pieces early: the unlink frees the rest.
  bool Release(const std::string& name) {
    IOOptions io;
    const uint64_t piece = h_->DeletePiece();
    uint64_t size = 0;
    uint64_t links = 0;
    std::unique_ptr<FSWritableFile> file;
    // Only a file with no other name is shrunk: a checkpoint or backup
    // hard-links table files, and shrinking the one inode would corrupt
    // every copy. An unlink of one link of several frees nothing anyway.
    // FileSystem::Truncate is not implemented by the POSIX file system; a
    // writable handle's Truncate is (ftruncate).
    if (piece > 0 && target()->NumFileLinks(name, io, &links, nullptr).ok() && links == 1 &&
        target()->GetFileSize(name, io, &size, nullptr).ok() &&
        target()->ReopenWritableFile(name, FileOptions(), &file, nullptr).ok()) {
      bool stopped = false;
      while (size > piece) {
        size -= piece;
        if (!file->Truncate(size, io, nullptr).ok()) break;
        std::unique_lock<std::mutex> l(deferred_mu_);
        if (deferred_cv_.wait_for(l, std::chrono::milliseconds(ROCKS_ENV_DELETE_PIECE_PAUSE_MS),
                                  [this] { return stop_; })) {
          stopped = true;
          break;
        }
      }
      file->Close(io, nullptr).PermitUncheckedError();
      if (stopped) return false;
    }
    target()->DeleteFile(name, io, nullptr).PermitUncheckedError();
    return true;
  }

  std::shared_ptr<const Handle> h_;
  std::mutex deferred_mu_;
  std::condition_variable deferred_cv_;
  std::deque<Deferred> deferred_;
  bool stop_ = false;
  std::thread deleter_;
};

// Runs a scheduled task between TASK_BEGIN and TASK_END reports.
struct ScheduledTask {
  void (*function)(void*);
  void* arg;
  void (*unschedule)(void*);
  std::shared_ptr<const Handle> h;

  static void Run(void* p) {
    std::unique_ptr<ScheduledTask> t(static_cast<ScheduledTask*>(p));
    t->h->Emit(ROCKS_ENV_EVENT_TASK_BEGIN);
    t->function(t->arg);
    t->h->Emit(ROCKS_ENV_EVENT_TASK_END);
  }

  // A task taken off the queue before it ran.
  static void Unschedule(void* p) {
    std::unique_ptr<ScheduledTask> t(static_cast<ScheduledTask*>(p));
    if (t->unschedule != nullptr) t->unschedule(t->arg);
  }
};

// The DB's Env: the application's Env for threads, clock and scheduling,
// the layer stack for files, and a report around every background task.
class StagedEnv : public rocksdb::CompositeEnvWrapper {
 public:
  StagedEnv(rocksdb::Env* base, const std::shared_ptr<FileSystem>& fs,
            std::shared_ptr<const Handle> h)
      : rocksdb::CompositeEnvWrapper(base, fs, base->GetSystemClock()),
        h_(std::move(h)) {}

  static const char* kClassName() { return "KvStageEnv"; }
  const char* Name() const override { return kClassName(); }

  void Schedule(void (*function)(void* arg), void* arg, Priority pri, void* tag,
                void (*unschedule)(void* arg)) override {
    auto* task = new ScheduledTask{function, arg, unschedule, h_};
    rocksdb::CompositeEnvWrapper::Schedule(&ScheduledTask::Run, task, pri, tag,
                                           &ScheduledTask::Unschedule);
  }

 private:
  std::shared_ptr<const Handle> h_;
};

class StageListener : public rocksdb::EventListener {
 public:
  explicit StageListener(std::shared_ptr<const Handle> h) : h_(std::move(h)) {}

  const char* Name() const override { return "KvStageListener"; }

  void OnFlushBegin(rocksdb::DB*, const rocksdb::FlushJobInfo& info) override {
    rocks_env_event ev = Event(ROCKS_ENV_EVENT_FLUSH_BEGIN, info.job_id);
    ev.reason = static_cast<uint8_t>(info.flush_reason);
    h_->Emit(ev);
  }

  void OnFlushCompleted(rocksdb::DB*,
                        const rocksdb::FlushJobInfo& info) override {
    rocks_env_event ev = Event(ROCKS_ENV_EVENT_FLUSH_COMPLETED, info.job_id);
    ev.reason = static_cast<uint8_t>(info.flush_reason);
    // The SST the flush wrote is complete now; its size is what the flush
    // produced. A failed stat leaves 0 rather than guessing.
    rocksdb::FileSystem::Default()
        ->GetFileSize(info.file_path, IOOptions(), &ev.bytes_written, nullptr)
        .PermitUncheckedError();
    h_->Emit(ev);
  }

  void OnCompactionBegin(rocksdb::DB*,
                         const rocksdb::CompactionJobInfo& ci) override {
    h_->Emit(Compaction(ROCKS_ENV_EVENT_COMPACTION_BEGIN, ci));
  }

  void OnCompactionCompleted(rocksdb::DB*,
                             const rocksdb::CompactionJobInfo& ci) override {
    rocks_env_event ev = Compaction(ROCKS_ENV_EVENT_COMPACTION_COMPLETED, ci);
    ev.bytes_written =
        ci.stats.total_output_bytes + ci.stats.total_output_bytes_blob;
    ev.bytes_read = ci.stats.total_input_bytes;
    h_->Emit(ev);
  }

  // Subcompactions run on other threads; the compaction they belong to is
  // counted once, by its own begin and completion.
  void OnSubcompactionBegin(const rocksdb::SubcompactionJobInfo& si) override {
    h_->Emit(Subcompaction(ROCKS_ENV_EVENT_SUBCOMPACTION_BEGIN, si));
  }

  void OnSubcompactionCompleted(
      const rocksdb::SubcompactionJobInfo& si) override {
    h_->Emit(Subcompaction(ROCKS_ENV_EVENT_SUBCOMPACTION_COMPLETED, si));
  }

  // Called on the thread whose job failed (or the writer whose WAL write
  // failed). The error is reported, not changed.
  void OnBackgroundError(rocksdb::BackgroundErrorReason reason,
                         rocksdb::Status* bg_error) override {
    rocks_env_event ev = Event(ROCKS_ENV_EVENT_BACKGROUND_ERROR, -1);
    ev.reason = static_cast<uint8_t>(reason);
    std::string message =
        bg_error != nullptr ? bg_error->ToString() : std::string("unknown");
    ev.message = message.c_str();
    h_->Emit(ev);
  }

 private:
  static rocks_env_event Event(uint8_t kind, int job_id) {
    rocks_env_event ev{};
    ev.kind = kind;
    ev.job_id = job_id;
    ev.base_input_level = -1;
    ev.output_level = 0;
    return ev;
  }

  static rocks_env_event Compaction(uint8_t kind,
                                    const rocksdb::CompactionJobInfo& ci) {
    rocks_env_event ev = Event(kind, ci.job_id);
    ev.reason = static_cast<uint8_t>(ci.compaction_reason);
    ev.base_input_level = ci.base_input_level;
    ev.output_level = ci.output_level;
    return ev;
  }

  static rocks_env_event Subcompaction(
      uint8_t kind, const rocksdb::SubcompactionJobInfo& si) {
    rocks_env_event ev = Event(kind, si.job_id);
    ev.reason = static_cast<uint8_t>(si.compaction_reason);
    ev.base_input_level = si.base_input_level;
    ev.output_level = si.output_level;
    return ev;
  }

  std::shared_ptr<const Handle> h_;
};

}  // namespace

extern "C" {

rocks_env_fs_t* rocks_env_fs_of_options(const rocksdb_options_t* options,
                                        int32_t* is_staged) {
  rocksdb::Env* env =
      options->rep.env != nullptr ? options->rep.env : rocksdb::Env::Default();
  std::shared_ptr<FileSystem> fs = env->GetFileSystem();
  if (is_staged != nullptr) {
    *is_staged = dynamic_cast<const HookFileSystem*>(fs.get()) != nullptr;
  }
  return new rocks_env_fs_t{std::move(fs)};
}

rocks_env_fs_t* rocks_env_fs_hook(const rocks_env_fs_t* below,
                                  const void* handle,
                                  const rocks_env_callbacks* callbacks) {
  auto h = std::make_shared<const Handle>(handle, *callbacks);
  return new rocks_env_fs_t{std::make_shared<HookFileSystem>(below->fs, h)};
}

void rocks_env_fs_destroy(rocks_env_fs_t* fs) { delete fs; }

rocksdb_env_t* rocks_env_create(const rocksdb_options_t* options,
                                const rocks_env_fs_t* fs, const void* handle,
                                const rocks_env_callbacks* callbacks) {
  auto h = std::make_shared<const Handle>(handle, *callbacks);
  rocksdb::Env* base =
      options->rep.env != nullptr ? options->rep.env : rocksdb::Env::Default();
  rocksdb_env_t* env = new rocksdb_env_t;
  env->rep = new StagedEnv(base, fs->fs, std::move(h));
  env->is_default = false;
  return env;
}

void rocks_env_add_listener(rocksdb_options_t* options, const void* handle,
                            const rocks_env_callbacks* callbacks) {
  auto h = std::make_shared<const Handle>(handle, *callbacks);
  options->rep.listeners.push_back(std::make_shared<StageListener>(h));
}

uint64_t rocks_env_probe_write_buffer_size(const rocksdb_options_t* options) {
  return options->rep.write_buffer_size;
}

size_t rocks_env_probe_listener_count(const rocksdb_options_t* options) {
  return options->rep.listeners.size();
}

int32_t rocks_env_probe_env_is_default(const rocksdb_env_t* env) {
  return env->is_default ? 1 : 0;
}

int32_t rocks_env_probe_env_is_ours(const rocksdb_env_t* env) {
  if (env == nullptr || env->rep == nullptr) return 0;
  const auto& fs = env->rep->GetFileSystem();
  return dynamic_cast<const HookFileSystem*>(fs.get()) != nullptr ? 1 : 0;
}

}  // extern "C"
