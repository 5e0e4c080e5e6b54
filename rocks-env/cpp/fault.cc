// A fault-injecting file system for tests, below the stage: it fails
// chosen operations on command, and it emulates a power cut by forgetting
// everything that was not made durable.
//
// Durability model (what survives a power cut):
// * the bytes of a file up to the length it had when a Sync or Fsync of it
//   last completed; RangeSync and Close make nothing durable;
// * a file created, or a rename, only once a later Fsync of its directory
//   completed; until then a power cut removes the file (or undoes the
//   rename, restoring the target's earlier contents when it had any);
// * deletions are taken as durable at once (a deleted file does not come
//   back).
//
// After `rocks_env_fault_power_cut` every operation fails, as on a machine
// that lost power; `rocks_env_fault_recover` (with the DB closed) puts the
// files in the state the model says a reboot would find, and lets
// operations through again.

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "rocksdb/file_system.h"
#include "shim.h"
#include "shim_internal.h"

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
using rocksdb::FSSequentialFile;
using rocksdb::FSSequentialFileOwnerWrapper;
using rocksdb::FSWritableFile;
using rocksdb::FSWritableFileOwnerWrapper;
using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

std::string DirOf(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// Strips trailing slashes so "dir/" and "dir" name the same directory.
std::string NormalDir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::optional<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

namespace rocks_env {

// What the fault layer knows and decides; shared by every file system built
// over it (a DB reopened with the same injector keeps the same model).
class FaultState {
 public:
  // Whether an operation fails now. Counts injected failures.
  bool ShouldFail(uint8_t op, uint8_t file_kind, const IOOptions* opts) {
    std::lock_guard<std::mutex> g(mu_);
    if (power_cut_) {
      ++injected_;
      return true;
    }
    if (!has_rule_) return false;
    if ((rule_.ops & (1u << op)) == 0) return false;
    if (rule_.files != 0 && (rule_.files & (1u << file_kind)) == 0) {
      return false;
    }
    if (rule_.activity >= 0) {
      int activity = opts != nullptr ? static_cast<int>(opts->io_activity) : -1;
      if (activity != rule_.activity) return false;
    }
    if (rule_.skip > 0) {
      --rule_.skip;
      return false;
    }
    if (rule_.count == 0) return false;
    if (rule_.count != UINT64_MAX) --rule_.count;
    ++injected_;
    return true;
  }

  IOStatus Check(uint8_t op, uint8_t file_kind, const IOOptions* opts) {
    if (!ShouldFail(op, file_kind, opts)) return IOStatus::OK();
    bool cut;
    {
      std::lock_guard<std::mutex> g(mu_);
      cut = power_cut_;
    }
    return IOStatus::IOError(cut ? "power cut (fault injection)"
                                 : "injected fault (fault injection)");
  }

  void SetRule(const rocks_env_fault_rule* rule) {
    std::lock_guard<std::mutex> g(mu_);
    has_rule_ = rule != nullptr;
    if (rule != nullptr) rule_ = *rule;
  }

  uint64_t Injected() {
    std::lock_guard<std::mutex> g(mu_);
    return injected_;
  }

  void PowerCut() {
    std::lock_guard<std::mutex> g(mu_);
    power_cut_ = true;
  }

  // A file opened for writing from scratch (`fresh`) or for appending.
  void Opened(const std::string& path, bool fresh, bool existed) {
    std::lock_guard<std::mutex> g(mu_);
    auto& f = files_[path];
    if (fresh) {
      f.written = 0;
      f.synced = 0;
    } else {
      struct stat st;
      uint64_t size = ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
      f.written = size;
      f.synced = size;
    }
    if (!existed) {
      pending_[NormalDir(DirOf(path))].push_back(Pending{path, "", {}});
    }
  }

  void Wrote(const std::string& path, uint64_t end) {
    std::lock_guard<std::mutex> g(mu_);
    auto& f = files_[path];
    if (end > f.written) f.written = end;
  }

  void Appended(const std::string& path, uint64_t n) {
    std::lock_guard<std::mutex> g(mu_);
    files_[path].written += n;
  }

  void Truncated(const std::string& path, uint64_t size) {
    std::lock_guard<std::mutex> g(mu_);
    auto& f = files_[path];
    f.written = size;
    if (f.synced > size) f.synced = size;
  }

  uint64_t Written(const std::string& path) {
    std::lock_guard<std::mutex> g(mu_);
    return files_[path].written;
  }

  // A Sync that began when `written_at_start` bytes were written completed.
  void Synced(const std::string& path, uint64_t written_at_start) {
    std::lock_guard<std::mutex> g(mu_);
    auto& f = files_[path];
    if (written_at_start > f.synced) f.synced = written_at_start;
  }

  void DirSynced(const std::string& dir) {
    std::lock_guard<std::mutex> g(mu_);
    pending_.erase(NormalDir(dir));
  }

  void Renamed(const std::string& src, const std::string& dst,
               std::optional<std::string> old_dst) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = files_.find(src);
    if (it != files_.end()) {
      files_[dst] = it->second;
      files_.erase(src);
    }
    // A rename of a file whose creation is not durable yet just moves the
    // pending creation.
    for (auto& [dir, ops] : pending_) {
      for (auto& p : ops) {
        if (p.rename_from.empty() && p.path == src) {
          p.path = dst;
          return;
        }
      }
    }
    pending_[NormalDir(DirOf(dst))].push_back(
        Pending{dst, src, std::move(old_dst)});
  }

  void Deleted(const std::string& path) {
    std::lock_guard<std::mutex> g(mu_);
    files_.erase(path);
    for (auto& [dir, ops] : pending_) {
      for (size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].rename_from.empty() && ops[i].path == path) {
          ops.erase(ops.begin() + i);
          return;
        }
      }
    }
  }

  // Applies the power cut to the files on disk; see the header comment.
  int Recover(rocks_env_fault_report* out, std::string* error) {
    std::lock_guard<std::mutex> g(mu_);
    rocks_env_fault_report rep{};
    // Undo renames, newest first, then remove creations.
    for (auto& [dir, ops] : pending_) {
      for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
        if (it->rename_from.empty()) continue;
        if (Exists(it->path) &&
            ::rename(it->path.c_str(), it->rename_from.c_str()) != 0) {
          *error = "cannot undo the rename of " + it->rename_from + " to " +
                   it->path + ": " + std::strerror(errno);
          return 1;
        }
        auto f = files_.find(it->path);
        if (f != files_.end()) {
          files_[it->rename_from] = f->second;
          files_.erase(f);
        }
        if (it->old_contents) {
          std::ofstream o(it->path, std::ios::binary | std::ios::trunc);
          o << *it->old_contents;
        }
        ++rep.renames_undone;
      }
      for (auto& p : ops) {
        if (!p.rename_from.empty()) continue;
        if (Exists(p.path)) {
          if (::unlink(p.path.c_str()) != 0) {
            *error = "cannot remove " + p.path + ": " + std::strerror(errno);
            return 1;
          }
          ++rep.files_removed;
        }
        files_.erase(p.path);
      }
    }
    pending_.clear();
    for (auto& [path, f] : files_) {
      struct stat st;
      if (::stat(path.c_str(), &st) != 0) continue;
      uint64_t size = st.st_size;
      if (size > f.synced) {
        if (::truncate(path.c_str(), f.synced) != 0) {
          *error = "cannot truncate " + path + ": " + std::strerror(errno);
          return 1;
        }
        rep.bytes_dropped += size - f.synced;
        ++rep.files_truncated;
      }
      f.written = f.synced;
    }
    power_cut_ = false;
    has_rule_ = false;
    *out = rep;
    return 0;
  }

 private:
  struct File {
    uint64_t written = 0;
    uint64_t synced = 0;
  };
  struct Pending {
    std::string path;                         // created file, or rename target
    std::string rename_from;                  // empty for a creation
    std::optional<std::string> old_contents;  // rename target's earlier data
  };

  std::mutex mu_;
  bool power_cut_ = false;
  bool has_rule_ = false;
  rocks_env_fault_rule rule_{};
  uint64_t injected_ = 0;
  std::map<std::string, File> files_;
  std::map<std::string, std::vector<Pending>> pending_;
};

}  // namespace rocks_env

struct rocks_env_fault_t {
  std::shared_ptr<rocks_env::FaultState> state;
};

namespace {

using rocks_env::FaultState;
using rocks_env::FileKindOf;

class FaultSequentialFile : public FSSequentialFileOwnerWrapper {
 public:
  FaultSequentialFile(std::unique_ptr<FSSequentialFile>&& t,
                      std::shared_ptr<FaultState> s, uint8_t kind)
      : FSSequentialFileOwnerWrapper(std::move(t)),
        s_(std::move(s)),
        kind_(kind) {}

  IOStatus Read(size_t n, const IOOptions& o, Slice* r, char* scratch,
                IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_READ, kind_, &o);
    if (!st.ok()) return st;
    return FSSequentialFileOwnerWrapper::Read(n, o, r, scratch, dbg);
  }

 private:
  std::shared_ptr<FaultState> s_;
  uint8_t kind_;
};

class FaultRandomAccessFile : public FSRandomAccessFileOwnerWrapper {
 public:
  FaultRandomAccessFile(std::unique_ptr<FSRandomAccessFile>&& t,
                        std::shared_ptr<FaultState> s, uint8_t kind)
      : FSRandomAccessFileOwnerWrapper(std::move(t)),
        s_(std::move(s)),
        kind_(kind) {}

  IOStatus Read(uint64_t off, size_t n, const IOOptions& o, Slice* r,
                char* scratch, IODebugContext* dbg) const override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_READ, kind_, &o);
    if (!st.ok()) return st;
    return FSRandomAccessFileOwnerWrapper::Read(off, n, o, r, scratch, dbg);
  }

 private:
  std::shared_ptr<FaultState> s_;
  uint8_t kind_;
};

class FaultWritableFile : public FSWritableFileOwnerWrapper {
 public:
  FaultWritableFile(std::unique_ptr<FSWritableFile>&& t,
                    std::shared_ptr<FaultState> s, std::string path)
      : FSWritableFileOwnerWrapper(std::move(t)),
        s_(std::move(s)),
        path_(std::move(path)),
        kind_(FileKindOf(path_)) {}

  IOStatus Append(const Slice& data, const IOOptions& o,
                  IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_WRITE, kind_, &o);
    if (!st.ok()) return st;
    st = FSWritableFileOwnerWrapper::Append(data, o, dbg);
    if (st.ok()) s_->Appended(path_, data.size());
    return st;
  }

  IOStatus Append(const Slice& data, const IOOptions& o,
                  const DataVerificationInfo& info,
                  IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_WRITE, kind_, &o);
    if (!st.ok()) return st;
    st = FSWritableFileOwnerWrapper::Append(data, o, info, dbg);
    if (st.ok()) s_->Appended(path_, data.size());
    return st;
  }

  IOStatus PositionedAppend(const Slice& data, uint64_t off, const IOOptions& o,
                            IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_WRITE, kind_, &o);
    if (!st.ok()) return st;
    st = FSWritableFileOwnerWrapper::PositionedAppend(data, off, o, dbg);
    if (st.ok()) s_->Wrote(path_, off + data.size());
    return st;
  }

  IOStatus PositionedAppend(const Slice& data, uint64_t off, const IOOptions& o,
                            const DataVerificationInfo& info,
                            IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_WRITE, kind_, &o);
    if (!st.ok()) return st;
    st = FSWritableFileOwnerWrapper::PositionedAppend(data, off, o, info, dbg);
    if (st.ok()) s_->Wrote(path_, off + data.size());
    return st;
  }

  IOStatus Truncate(uint64_t size, const IOOptions& o,
                    IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_TRUNCATE, kind_, &o);
    if (!st.ok()) return st;
    st = FSWritableFileOwnerWrapper::Truncate(size, o, dbg);
    if (st.ok()) s_->Truncated(path_, size);
    return st;
  }

  IOStatus Close(const IOOptions& o, IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_CLOSE, kind_, &o);
    if (!st.ok()) return st;
    return FSWritableFileOwnerWrapper::Close(o, dbg);
  }

  IOStatus Sync(const IOOptions& o, IODebugContext* dbg) override {
    return DoSync(ROCKS_ENV_OP_SYNC, o,
                  [&] { return FSWritableFileOwnerWrapper::Sync(o, dbg); });
  }

  IOStatus Fsync(const IOOptions& o, IODebugContext* dbg) override {
    return DoSync(ROCKS_ENV_OP_FSYNC, o,
                  [&] { return FSWritableFileOwnerWrapper::Fsync(o, dbg); });
  }

  IOStatus RangeSync(uint64_t off, uint64_t n, const IOOptions& o,
                     IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_RANGE_SYNC, kind_, &o);
    if (!st.ok()) return st;
    return FSWritableFileOwnerWrapper::RangeSync(off, n, o, dbg);
  }

 private:
  template <typename F>
  IOStatus DoSync(uint8_t op, const IOOptions& o, F sync) {
    IOStatus st = s_->Check(op, kind_, &o);
    if (!st.ok()) return st;
    // What was written before the sync began is durable once it returns.
    uint64_t written = s_->Written(path_);
    st = sync();
    if (st.ok()) s_->Synced(path_, written);
    return st;
  }

  std::shared_ptr<FaultState> s_;
  std::string path_;
  uint8_t kind_;
};

class FaultDirectory : public FSDirectoryWrapper {
 public:
  FaultDirectory(std::unique_ptr<FSDirectory>&& t,
                 std::shared_ptr<FaultState> s, std::string dir)
      : FSDirectoryWrapper(std::move(t)),
        s_(std::move(s)),
        dir_(std::move(dir)) {}

  IOStatus Fsync(const IOOptions& o, IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_FSYNC, ROCKS_ENV_FILE_DIR, &o);
    if (!st.ok()) return st;
    st = FSDirectoryWrapper::Fsync(o, dbg);
    if (st.ok()) s_->DirSynced(dir_);
    return st;
  }

  IOStatus FsyncWithDirOptions(const IOOptions& o, IODebugContext* dbg,
                               const DirFsyncOptions& d) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_FSYNC, ROCKS_ENV_FILE_DIR, &o);
    if (!st.ok()) return st;
    st = FSDirectoryWrapper::FsyncWithDirOptions(o, dbg, d);
    if (st.ok()) s_->DirSynced(dir_);
    return st;
  }

 private:
  std::shared_ptr<FaultState> s_;
  std::string dir_;
};

class FaultFileSystem : public FileSystemWrapper {
 public:
  FaultFileSystem(const std::shared_ptr<FileSystem>& base,
                  std::shared_ptr<FaultState> s)
      : FileSystemWrapper(base), s_(std::move(s)) {}

  static const char* kClassName() { return "KvStageFaultFileSystem"; }
  const char* Name() const override { return kClassName(); }

  IOStatus NewSequentialFile(const std::string& f, const FileOptions& o,
                             std::unique_ptr<FSSequentialFile>* r,
                             IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_OPEN, FileKindOf(f), &o.io_options);
    if (!st.ok()) return st;
    std::unique_ptr<FSSequentialFile> file;
    st = target()->NewSequentialFile(f, o, &file, dbg);
    if (st.ok()) {
      r->reset(new FaultSequentialFile(std::move(file), s_, FileKindOf(f)));
    }
    return st;
  }

  IOStatus NewRandomAccessFile(const std::string& f, const FileOptions& o,
                               std::unique_ptr<FSRandomAccessFile>* r,
                               IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_OPEN, FileKindOf(f), &o.io_options);
    if (!st.ok()) return st;
    std::unique_ptr<FSRandomAccessFile> file;
    st = target()->NewRandomAccessFile(f, o, &file, dbg);
    if (st.ok()) {
      r->reset(new FaultRandomAccessFile(std::move(file), s_, FileKindOf(f)));
    }
    return st;
  }

  IOStatus NewWritableFile(const std::string& f, const FileOptions& o,
                           std::unique_ptr<FSWritableFile>* r,
                           IODebugContext* dbg) override {
    return OpenWritable(f, o, true, r, [&](auto* file) {
      return target()->NewWritableFile(f, o, file, dbg);
    });
  }

  IOStatus ReopenWritableFile(const std::string& f, const FileOptions& o,
                              std::unique_ptr<FSWritableFile>* r,
                              IODebugContext* dbg) override {
    return OpenWritable(f, o, false, r, [&](auto* file) {
      return target()->ReopenWritableFile(f, o, file, dbg);
    });
  }

  IOStatus ReuseWritableFile(const std::string& f, const std::string& old_f,
                             const FileOptions& o,
                             std::unique_ptr<FSWritableFile>* r,
                             IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_RENAME, FileKindOf(f), &o.io_options);
    if (!st.ok()) return st;
    std::optional<std::string> old = ReadAll(f);
    std::unique_ptr<FSWritableFile> file;
    st = target()->ReuseWritableFile(f, old_f, o, &file, dbg);
    if (st.ok()) {
      s_->Renamed(old_f, f, std::move(old));
      s_->Opened(f, true, true);
      r->reset(new FaultWritableFile(std::move(file), s_, f));
    }
    return st;
  }

  IOStatus NewDirectory(const std::string& name, const IOOptions& io,
                        std::unique_ptr<FSDirectory>* r,
                        IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_OPEN, ROCKS_ENV_FILE_DIR, &io);
    if (!st.ok()) return st;
    std::unique_ptr<FSDirectory> dir;
    st = target()->NewDirectory(name, io, &dir, dbg);
    if (st.ok()) r->reset(new FaultDirectory(std::move(dir), s_, name));
    return st;
  }

  IOStatus DeleteFile(const std::string& f, const IOOptions& o,
                      IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_DELETE, FileKindOf(f), &o);
    if (!st.ok()) return st;
    st = target()->DeleteFile(f, o, dbg);
    if (st.ok()) s_->Deleted(f);
    return st;
  }

  IOStatus RenameFile(const std::string& src, const std::string& dst,
                      const IOOptions& o, IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_RENAME, FileKindOf(dst), &o);
    if (!st.ok()) return st;
    std::optional<std::string> old = ReadAll(dst);
    st = target()->RenameFile(src, dst, o, dbg);
    if (st.ok()) s_->Renamed(src, dst, std::move(old));
    return st;
  }

  IOStatus LinkFile(const std::string& src, const std::string& dst,
                    const IOOptions& o, IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_LINK, FileKindOf(dst), &o);
    if (!st.ok()) return st;
    return target()->LinkFile(src, dst, o, dbg);
  }

  IOStatus Truncate(const std::string& f, size_t size, const IOOptions& o,
                    IODebugContext* dbg) override {
    IOStatus st = s_->Check(ROCKS_ENV_OP_TRUNCATE, FileKindOf(f), &o);
    if (!st.ok()) return st;
    st = target()->Truncate(f, size, o, dbg);
    if (st.ok()) s_->Truncated(f, size);
    return st;
  }

  // The info log opens through NewWritableFile (of this layer).
  IOStatus NewLogger(const std::string& fname, const IOOptions& options,
                     std::shared_ptr<rocksdb::Logger>* result,
                     IODebugContext* dbg) override {
    return FileSystem::NewLogger(fname, options, result, dbg);
  }

 private:
  template <typename OpenFn>
  IOStatus OpenWritable(const std::string& f, const FileOptions& o, bool fresh,
                        std::unique_ptr<FSWritableFile>* r, OpenFn open) {
    IOStatus st = s_->Check(ROCKS_ENV_OP_OPEN, FileKindOf(f), &o.io_options);
    if (!st.ok()) return st;
    bool existed = Exists(f);
    std::unique_ptr<FSWritableFile> file;
    st = open(&file);
    if (st.ok()) {
      s_->Opened(f, fresh, existed);
      r->reset(new FaultWritableFile(std::move(file), s_, f));
    }
    return st;
  }

  std::shared_ptr<FaultState> s_;
};

}  // namespace

extern "C" {

rocks_env_fault_t* rocks_env_fault_new(void) {
  return new rocks_env_fault_t{std::make_shared<rocks_env::FaultState>()};
}

void rocks_env_fault_free(rocks_env_fault_t* fault) { delete fault; }

void rocks_env_fault_set_rule(rocks_env_fault_t* fault,
                              const rocks_env_fault_rule* rule) {
  fault->state->SetRule(rule);
}

uint64_t rocks_env_fault_injected(const rocks_env_fault_t* fault) {
  return fault->state->Injected();
}

void rocks_env_fault_power_cut(rocks_env_fault_t* fault) {
  fault->state->PowerCut();
}

int32_t rocks_env_fault_recover(rocks_env_fault_t* fault,
                                rocks_env_fault_report* report, char* msg,
                                size_t msg_len) {
  std::string error;
  int rc = fault->state->Recover(report, &error);
  if (rc != 0 && msg != nullptr && msg_len > 0) {
    size_t n = std::min(error.size(), msg_len - 1);
    std::memcpy(msg, error.data(), n);
    msg[n] = '\0';
  }
  return rc;
}

rocks_env_fs_t* rocks_env_fs_fault(const rocks_env_fs_t* below,
                                   const rocks_env_fault_t* fault) {
  return new rocks_env_fs_t{
      std::make_shared<FaultFileSystem>(below->fs, fault->state)};
}

}  // extern "C"
