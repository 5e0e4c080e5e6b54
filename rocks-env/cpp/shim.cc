// RocksDB side of rocks-env: a FileSystem wrapper that hands every request to
// Rust before it happens, and an EventListener that tags the threads running
// flushes and compactions. See shim.h for the C ABI.

#include "shim.h"

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"

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

// kv-stage RequestType discriminants.
enum Kind : uint8_t {
  kRead = 0,
  kWrite = 1,
  kSync = 2,
  kOpen = 3,
  kClose = 4,
  kDelete = 5,
  kRename = 6,
  kTruncate = 7,
  kMetadata = 8,
};

constexpr uint8_t kUnknownActivity = 0xFF;

// What the listener says this thread is doing: the job (flush or
// compaction) and, inside a compaction, the subcompaction.
thread_local uint8_t tls_job = ROCKS_ENV_JOB_NONE;
thread_local uint8_t tls_subjob = ROCKS_ENV_JOB_NONE;

inline uint8_t ThreadJob() {
  return tls_subjob != ROCKS_ENV_JOB_NONE ? tls_subjob : tls_job;
}

// The Rust handle plus its callbacks; the last owner releases the handle.
class Handle {
 public:
  Handle(const void* handle, const rocks_env_callbacks& cbs)
      : handle_(handle), cbs_(cbs) {}
  ~Handle() { cbs_.release(handle_); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  IOStatus Enforce(uint8_t kind, uint8_t file_kind, uint64_t size,
                   const IOOptions* opts) const {
    rocks_env_request req;
    req.size = size;
    req.kind = kind;
    req.file_kind = file_kind;
    req.io_activity = opts != nullptr ? static_cast<uint8_t>(opts->io_activity)
                                      : kUnknownActivity;
    req.job_ctx = ThreadJob();
    char msg[256];
    msg[0] = '\0';
    int32_t rc = cbs_.enforce(handle_, &req, msg, sizeof(msg));
    if (rc == 0) {
      return IOStatus::OK();
    }
    msg[sizeof(msg) - 1] = '\0';
    return IOStatus::IOError("kv-stage refused the request", msg);
  }

  void Emit(const rocks_env_event& ev) const { cbs_.event(handle_, &ev); }

 private:
  const void* handle_;
  rocks_env_callbacks cbs_;
};

uint8_t FileKindOf(std::string_view path) {
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

class StagedSequentialFile : public FSSequentialFileOwnerWrapper {
 public:
  StagedSequentialFile(std::unique_ptr<FSSequentialFile>&& t,
                       std::shared_ptr<const Handle> h, uint8_t kind)
      : FSSequentialFileOwnerWrapper(std::move(t)),
        h_(std::move(h)),
        kind_(kind) {}

  IOStatus Read(size_t n, const IOOptions& options, Slice* result,
                char* scratch, IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kRead, kind_, n, &options);
    if (!s.ok()) return s;
    return FSSequentialFileOwnerWrapper::Read(n, options, result, scratch, dbg);
  }

  IOStatus PositionedRead(uint64_t offset, size_t n, const IOOptions& options,
                          Slice* result, char* scratch,
                          IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kRead, kind_, n, &options);
    if (!s.ok()) return s;
    return FSSequentialFileOwnerWrapper::PositionedRead(offset, n, options,
                                                        result, scratch, dbg);
  }

 private:
  std::shared_ptr<const Handle> h_;
  uint8_t kind_;
};

class StagedRandomAccessFile : public FSRandomAccessFileOwnerWrapper {
 public:
  StagedRandomAccessFile(std::unique_ptr<FSRandomAccessFile>&& t,
                         std::shared_ptr<const Handle> h, uint8_t kind)
      : FSRandomAccessFileOwnerWrapper(std::move(t)),
        h_(std::move(h)),
        kind_(kind) {}

  IOStatus Read(uint64_t offset, size_t n, const IOOptions& options,
                Slice* result, char* scratch,
                IODebugContext* dbg) const override {
    IOStatus s = h_->Enforce(kRead, kind_, n, &options);
    if (!s.ok()) return s;
    return FSRandomAccessFileOwnerWrapper::Read(offset, n, options, result,
                                                scratch, dbg);
  }

  IOStatus MultiRead(FSReadRequest* reqs, size_t num_reqs,
                     const IOOptions& options, IODebugContext* dbg) override {
    uint64_t total = 0;
    for (size_t i = 0; i < num_reqs; ++i) total += reqs[i].len;
    IOStatus s = h_->Enforce(kRead, kind_, total, &options);
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
    IOStatus s = h_->Enforce(kRead, kind_, req.len, &opts);
    if (!s.ok()) return s;
    return FSRandomAccessFileOwnerWrapper::ReadAsync(req, opts, cb, cb_arg,
                                                     io_handle, del_fn, dbg);
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
  uint8_t kind_;
};

class StagedWritableFile : public FSWritableFileOwnerWrapper {
 public:
  StagedWritableFile(std::unique_ptr<FSWritableFile>&& t,
                     std::shared_ptr<const Handle> h, uint8_t kind)
      : FSWritableFileOwnerWrapper(std::move(t)),
        h_(std::move(h)),
        kind_(kind) {}

  IOStatus Append(const Slice& data, const IOOptions& options,
                  IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kWrite, kind_, data.size(), &options);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::Append(data, options, dbg);
  }

  IOStatus Append(const Slice& data, const IOOptions& options,
                  const DataVerificationInfo& info,
                  IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kWrite, kind_, data.size(), &options);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::Append(data, options, info, dbg);
  }

  IOStatus PositionedAppend(const Slice& data, uint64_t offset,
                            const IOOptions& options,
                            IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kWrite, kind_, data.size(), &options);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options,
                                                        dbg);
  }

  IOStatus PositionedAppend(const Slice& data, uint64_t offset,
                            const IOOptions& options,
                            const DataVerificationInfo& info,
                            IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kWrite, kind_, data.size(), &options);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options,
                                                        info, dbg);
  }

  IOStatus Truncate(uint64_t size, const IOOptions& options,
                    IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kTruncate, kind_, 0, &options);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::Truncate(size, options, dbg);
  }

  IOStatus Close(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kClose, kind_, 0, &options);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::Close(options, dbg);
  }

  IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kSync, kind_, 0, &options);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::Sync(options, dbg);
  }

  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kSync, kind_, 0, &options);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::Fsync(options, dbg);
  }

  IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const IOOptions& options,
                     IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kSync, kind_, 0, &options);
    if (!s.ok()) return s;
    return FSWritableFileOwnerWrapper::RangeSync(offset, nbytes, options, dbg);
  }

 private:
  std::shared_ptr<const Handle> h_;
  uint8_t kind_;
};

class StagedRandomRWFile : public FSRandomRWFileOwnerWrapper {
 public:
  StagedRandomRWFile(std::unique_ptr<FSRandomRWFile>&& t,
                     std::shared_ptr<const Handle> h, uint8_t kind)
      : FSRandomRWFileOwnerWrapper(std::move(t)),
        h_(std::move(h)),
        kind_(kind) {}

  IOStatus Write(uint64_t offset, const Slice& data, const IOOptions& options,
                 IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kWrite, kind_, data.size(), &options);
    if (!s.ok()) return s;
    return FSRandomRWFileOwnerWrapper::Write(offset, data, options, dbg);
  }

  IOStatus Read(uint64_t offset, size_t n, const IOOptions& options,
                Slice* result, char* scratch,
                IODebugContext* dbg) const override {
    IOStatus s = h_->Enforce(kRead, kind_, n, &options);
    if (!s.ok()) return s;
    return FSRandomRWFileOwnerWrapper::Read(offset, n, options, result, scratch,
                                            dbg);
  }

  IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kSync, kind_, 0, &options);
    if (!s.ok()) return s;
    return FSRandomRWFileOwnerWrapper::Sync(options, dbg);
  }

  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kSync, kind_, 0, &options);
    if (!s.ok()) return s;
    return FSRandomRWFileOwnerWrapper::Fsync(options, dbg);
  }

  IOStatus Close(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kClose, kind_, 0, &options);
    if (!s.ok()) return s;
    return FSRandomRWFileOwnerWrapper::Close(options, dbg);
  }

 private:
  std::shared_ptr<const Handle> h_;
  uint8_t kind_;
};

class StagedDirectory : public FSDirectoryWrapper {
 public:
  StagedDirectory(std::unique_ptr<FSDirectory>&& t,
                  std::shared_ptr<const Handle> h)
      : FSDirectoryWrapper(std::move(t)), h_(std::move(h)) {}

  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kSync, ROCKS_ENV_FILE_DIR, 0, &options);
    if (!s.ok()) return s;
    return FSDirectoryWrapper::Fsync(options, dbg);
  }

  IOStatus FsyncWithDirOptions(const IOOptions& options, IODebugContext* dbg,
                               const DirFsyncOptions& dir_opts) override {
    IOStatus s = h_->Enforce(kSync, ROCKS_ENV_FILE_DIR, 0, &options);
    if (!s.ok()) return s;
    return FSDirectoryWrapper::FsyncWithDirOptions(options, dbg, dir_opts);
  }

 private:
  std::shared_ptr<const Handle> h_;
};

class StagedFileSystem : public FileSystemWrapper {
 public:
  StagedFileSystem(const std::shared_ptr<FileSystem>& base,
                   std::shared_ptr<const Handle> h)
      : FileSystemWrapper(base), h_(std::move(h)) {}

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

  IOStatus DeleteFile(const std::string& f, const IOOptions& options,
                      IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kDelete, FileKindOf(f), 0, &options);
    if (!s.ok()) return s;
    return target()->DeleteFile(f, options, dbg);
  }

  IOStatus Truncate(const std::string& f, size_t size, const IOOptions& options,
                    IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kTruncate, FileKindOf(f), 0, &options);
    if (!s.ok()) return s;
    return target()->Truncate(f, size, options, dbg);
  }

  IOStatus DeleteDir(const std::string& d, const IOOptions& options,
                     IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kDelete, ROCKS_ENV_FILE_DIR, 0, &options);
    if (!s.ok()) return s;
    return target()->DeleteDir(d, options, dbg);
  }

  IOStatus RenameFile(const std::string& src, const std::string& dst,
                      const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kRename, FileKindOf(dst), 0, &options);
    if (!s.ok()) return s;
    return target()->RenameFile(src, dst, options, dbg);
  }

  IOStatus LinkFile(const std::string& src, const std::string& dst,
                    const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = h_->Enforce(kMetadata, FileKindOf(dst), 0, &options);
    if (!s.ok()) return s;
    return target()->LinkFile(src, dst, options, dbg);
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
    uint8_t kind = FileKindOf(f);
    IOStatus s = h_->Enforce(kOpen, kind, 0, &o.io_options);
    if (!s.ok()) return s;
    std::unique_ptr<File> file;
    s = open(&file);
    if (s.ok()) r->reset(new Staged(std::move(file), h_, kind));
    return s;
  }

  std::shared_ptr<const Handle> h_;
};

class StageListener : public rocksdb::EventListener {
 public:
  explicit StageListener(std::shared_ptr<const Handle> h) : h_(std::move(h)) {}

  const char* Name() const override { return "KvStageListener"; }

  void OnFlushBegin(rocksdb::DB*, const rocksdb::FlushJobInfo&) override {
    tls_job = ROCKS_ENV_JOB_FLUSH;
    Emit(ROCKS_ENV_EVENT_FLUSH_BEGIN, -1, 0, 0);
  }

  void OnFlushCompleted(rocksdb::DB*,
                        const rocksdb::FlushJobInfo& info) override {
    uint64_t size = 0;
    // The SST the flush wrote is complete now; its size is what the flush
    // produced. A failed stat leaves 0 rather than guessing.
    rocksdb::FileSystem::Default()
        ->GetFileSize(info.file_path, IOOptions(), &size, nullptr)
        .PermitUncheckedError();
    Emit(ROCKS_ENV_EVENT_FLUSH_COMPLETED, -1, size, 0);
    tls_job = ROCKS_ENV_JOB_NONE;
  }

  void OnCompactionBegin(rocksdb::DB*,
                         const rocksdb::CompactionJobInfo& ci) override {
    tls_job = JobFor(ci.base_input_level);
    Emit(ROCKS_ENV_EVENT_COMPACTION_BEGIN, ci.base_input_level, 0, 0);
  }

  void OnCompactionCompleted(rocksdb::DB*,
                             const rocksdb::CompactionJobInfo& ci) override {
    Emit(ROCKS_ENV_EVENT_COMPACTION_COMPLETED, ci.base_input_level,
         ci.stats.total_output_bytes + ci.stats.total_output_bytes_blob,
         ci.stats.total_input_bytes);
    tls_job = ROCKS_ENV_JOB_NONE;
  }

  // Subcompactions run on other threads: tag them, but report nothing (the
  // compaction they belong to is counted once).
  void OnSubcompactionBegin(const rocksdb::SubcompactionJobInfo& si) override {
    tls_subjob = JobFor(si.base_input_level);
  }

  void OnSubcompactionCompleted(const rocksdb::SubcompactionJobInfo&) override {
    tls_subjob = ROCKS_ENV_JOB_NONE;
  }

 private:
  static uint8_t JobFor(int base_input_level) {
    return base_input_level == 0 ? ROCKS_ENV_JOB_COMPACTION_L0
                                 : ROCKS_ENV_JOB_COMPACTION_LN;
  }

  void Emit(uint8_t kind, int base, uint64_t written, uint64_t read) {
    rocks_env_event ev;
    ev.kind = kind;
    ev.base_input_level = base;
    ev.bytes_written = written;
    ev.bytes_read = read;
    h_->Emit(ev);
  }

  std::shared_ptr<const Handle> h_;
};

}  // namespace

extern "C" {

rocksdb_env_t* rocks_env_create(const void* handle,
                                const rocks_env_callbacks* callbacks) {
  auto h = std::make_shared<const Handle>(handle, *callbacks);
  auto fs = std::make_shared<StagedFileSystem>(FileSystem::Default(), h);
  rocksdb_env_t* env = new rocksdb_env_t;
  env->rep = rocksdb::NewCompositeEnv(fs).release();
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
  return dynamic_cast<const StagedFileSystem*>(fs.get()) != nullptr ? 1 : 0;
}

}  // extern "C"
