//! Building the RocksDB `Env` and listener that carry a DB's handle into the
//! C++ shim, and the probes of the private C-API layouts the shim relies on.

use std::sync::Arc;

use rocksdb::AsRawPtr;

use crate::ffi;
use crate::io::DbIo;

/// A RocksDB `Env` whose file system sends every request through `io`.
#[expect(unsafe_code, reason = "creating an Env in the shim and handing it to the rocksdb crate")]
pub(crate) fn staged_env(io: &Arc<DbIo>) -> rocksdb::Env {
    let handle = io.raw_reference();
    // SAFETY: `handle` is one strong reference to a live `DbIo`, which the
    // shim owns from now on and gives back through the release callback.
    // `CALLBACKS` is a static. The shim never returns null.
    let raw = unsafe { ffi::rocks_env_create(handle, &ffi::CALLBACKS) };
    // SAFETY: `raw` is a fresh `rocksdb_env_t` whose `rep` is owned (not the
    // default env); `Env` takes ownership and destroys it exactly once with
    // `rocksdb_env_destroy`, which deletes `rep` and with it the wrapper.
    unsafe { rocksdb::Env::from_raw(raw) }
}

/// Adds the tagging event listener to `options`.
#[expect(unsafe_code, reason = "pushing a listener onto the C++ Options behind the rocksdb crate's handle")]
pub(crate) fn add_listener(options: &mut rocksdb::Options, io: &Arc<DbIo>) {
    let handle = io.raw_reference();
    // SAFETY: `as_raw_ptr` returns the live `rocksdb_options_t` owned by
    // `options`, which we borrow mutably; the shim appends a listener holding
    // one strong reference to `io` (given back when the last copy of the
    // listener is destroyed).
    unsafe {
        let raw = options.as_raw_ptr();
        ffi::rocks_env_add_listener(raw, handle, &ffi::CALLBACKS);
    }
}

/// What the shim reads through the private `rocksdb_options_t` layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionsProbe {
    /// `Options::write_buffer_size` as the shim sees it.
    pub write_buffer_size: u64,
    /// Number of event listeners as the shim sees it.
    pub listeners: usize,
}

/// Reads fields of `options` through the shim's copy of the private
/// `rocksdb_options_t` layout. A test compares them with what was set
/// through the public API; if they differ, the layout changed.
#[expect(unsafe_code, reason = "reading the C++ Options through the shim")]
pub fn probe_options(options: &rocksdb::Options) -> OptionsProbe {
    // SAFETY: `as_raw_ptr` returns the live `rocksdb_options_t` owned by
    // `options`, borrowed for the duration of the calls, which only read.
    unsafe {
        let raw = options.as_raw_ptr();
        OptionsProbe {
            write_buffer_size: ffi::rocks_env_probe_write_buffer_size(raw),
            listeners: ffi::rocks_env_probe_listener_count(raw),
        }
    }
}

/// What the shim reads through the private `rocksdb_env_t` layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvProbe {
    /// `is_default` of the struct.
    pub is_default: bool,
    /// Whether the Env's file system is the staged wrapper.
    pub is_staged: bool,
}

/// Reads an `Env` through the shim's copy of the private `rocksdb_env_t`
/// layout.
#[expect(unsafe_code, reason = "reading a C Env struct through the shim")]
pub fn probe_env(env: &rocksdb::Env) -> EnvProbe {
    // SAFETY: `as_raw_ptr` returns the live `rocksdb_env_t` owned by `env`,
    // borrowed for the duration of the calls, which only read.
    unsafe {
        let raw = env.as_raw_ptr();
        EnvProbe {
            is_default: ffi::rocks_env_probe_env_is_default(raw) != 0,
            is_staged: ffi::rocks_env_probe_env_is_ours(raw) != 0,
        }
    }
}

/// A staged `Env` for a throw-away handle, for the layout test.
pub fn probe_staged_env() -> EnvProbe {
    let io = DbIo::new(Arc::new(kv_stage::Stage::new("probe")), kv_stage::InstanceId(0), None);
    probe_env(&staged_env(&io))
}
