// Declarations the shim's C++ files share (not part of the C ABI).

#ifndef ROCKS_ENV_SHIM_INTERNAL_H
#define ROCKS_ENV_SHIM_INTERNAL_H

#include <cstdint>
#include <memory>
#include <string_view>

#include "rocksdb/file_system.h"

struct rocks_env_fs_t {
  std::shared_ptr<rocksdb::FileSystem> fs;
};

namespace rocks_env {

// The rocks_env_file_kind of a path, from its file name.
uint8_t FileKindOf(std::string_view path);

}  // namespace rocks_env

#endif  // ROCKS_ENV_SHIM_INTERNAL_H
