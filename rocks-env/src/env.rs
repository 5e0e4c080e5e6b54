//! Building a DB's file system stack, Env and listener in the C++ shim
//! (the `unsafe` sites), and the probes of the private C-API layouts the
//! shim relies on.

use std::sync::Arc;

use rocksdb::AsRawPtr;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::fault::FaultInjection;
use crate::ffi::{self, RawFs, Sink, Vtable};
use crate::io::DbIo;

/// An owned `rocks_env_fs_t`.
struct Fs(*mut RawFs);

impl Drop for Fs {
    #[expect(unsafe_code, reason = "destroying a file system layer the shim created")]
    fn drop(&mut self) {
        // SAFETY: `self.0` came from one of the shim's `rocks_env_fs_*`
        // constructors and is destroyed exactly once, here.
        unsafe { ffi::rocks_env_fs_destroy(self.0) }
    }
}

impl Fs {
    /// A hook layer over `self` that hands requests to `sink`.
    #[expect(unsafe_code, reason = "stacking a hook layer in the shim")]
    fn hook<S: Sink>(&self, sink: &Arc<S>) -> Fs {
        let handle = ffi::raw_reference(sink);
        // SAFETY: `self.0` is a live layer; `handle` is one strong reference
        // the new layer owns and gives back through the release callback;
        // the shim copies the callbacks.
        Fs(unsafe { ffi::rocks_env_fs_hook(self.0, handle, &Vtable::<S>::CALLBACKS) })
    }
}

/// A RocksDB `Env` for `io`'s DB: the Env `options` carry (RocksDB's
/// default when they carry none) for threads, clock and scheduling, and for
/// files the stack: the stage's hook layer, then the emulated device's and
/// the fault injector's when given, over that Env's own file system.
#[expect(unsafe_code, reason = "building the layer stack and Env in the shim")]
pub(crate) fn staged_env(
    options: &rocksdb::Options,
    io: &Arc<DbIo>,
    device: Option<&Arc<Device>>,
    fault: Option<&FaultInjection>,
) -> Result<rocksdb::Env> {
    let mut is_staged = 0i32;
    // SAFETY: `as_raw_ptr` returns the live `rocksdb_options_t` owned by
    // `options`, borrowed for the call, which only reads its Env pointer.
    let base = Fs(unsafe { ffi::rocks_env_fs_of_options(options.as_raw_ptr(), &mut is_staged) });
    if is_staged != 0 {
        return Err(Error::Config(
            "the options already carry a staged Env (from another StagedDb); give the builder options with \
             the Env you want staged, or none"
                .into(),
        ));
    }
    let mut fs = base;
    if let Some(f) = fault {
        // SAFETY: `fs` is a live layer and `f` a live injector; the new
        // layer holds its own reference to the injector's state.
        fs = Fs(unsafe { ffi::rocks_env_fs_fault(fs.0, f.raw()) });
    }
    if let Some(d) = device {
        fs = fs.hook(d);
    }
    let fs = fs.hook(io);
    let handle = ffi::raw_reference(io);
    // SAFETY: `options` and `fs` are live for the call; the Env takes its
    // own reference to the file system and owns `handle` (one strong
    // reference, given back through the release callback).
    let raw = unsafe { ffi::rocks_env_create(options.as_raw_ptr(), fs.0, handle, &Vtable::<DbIo>::CALLBACKS) };
    // SAFETY: `raw` is a fresh `rocksdb_env_t` whose `rep` is owned (not
    // the default env); `Env` takes ownership and destroys it exactly once
    // with `rocksdb_env_destroy`, which deletes `rep` and with it the stack.
    Ok(unsafe { rocksdb::Env::from_raw(raw) })
}

/// Adds the reporting event listener to `options`.
#[expect(unsafe_code, reason = "pushing a listener onto the C++ Options behind the rocksdb crate's handle")]
pub(crate) fn add_listener(options: &mut rocksdb::Options, io: &Arc<DbIo>) {
    let handle = ffi::raw_reference(io);
    // SAFETY: `as_raw_ptr` returns the live `rocksdb_options_t` owned by
    // `options`, which we borrow mutably; the shim appends a listener holding
    // one strong reference to `io` (given back when the last copy of the
    // listener is destroyed) and copies the callbacks.
    unsafe {
        let raw = options.as_raw_ptr();
        ffi::rocks_env_add_listener(raw, handle, &Vtable::<DbIo>::CALLBACKS);
    }
}

/// Gives `options` an SST file manager on `env` whose delete scheduler
/// removes obsolete table, blob and WAL files at `bytes_per_sec` (RocksDB's
/// rate-limited deletion): a deleted file is renamed to `*.trash` at once
/// and unlinked by the scheduler's thread, one file after the other, each
/// after the previous one's size at that rate has passed. Trash above
/// `trash_ratio` times the DB's size is deleted at once.
#[expect(unsafe_code, reason = "setting RocksDB's SstFileManager through its C API")]
pub(crate) fn set_delete_rate(
    options: &mut rocksdb::Options,
    env: &rocksdb::Env,
    bytes_per_sec: u64,
    trash_ratio: f64,
) {
    let rate = i64::try_from(bytes_per_sec).unwrap_or(i64::MAX);
    // SAFETY: `env.as_raw_ptr()` is the live `rocksdb_env_t` the DB will run
    // on; the manager keeps a pointer to its Env, and `StagedDb` drops the
    // options holding the manager (and the DB) before that Env. The C API's
    // manager is a wrapper holding one shared reference: the options copy
    // it, and destroying the wrapper drops only the wrapper's. `options` is
    // borrowed mutably for the calls.
    unsafe {
        let sfm = librocksdb_sys::rocksdb_sst_file_manager_create(env.as_raw_ptr());
        librocksdb_sys::rocksdb_sst_file_manager_set_delete_rate_bytes_per_second(sfm, rate);
        librocksdb_sys::rocksdb_sst_file_manager_set_max_trash_db_ratio(sfm, trash_ratio);
        librocksdb_sys::rocksdb_options_set_sst_file_manager(options.as_raw_ptr(), sfm);
        librocksdb_sys::rocksdb_sst_file_manager_destroy(sfm);
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
    let io = DbIo::new(Arc::new(kv_stage::Stage::new("probe")), kv_stage::InstanceId(0));
    let env = staged_env(&rocksdb::Options::default(), &io, None, None).expect("default options carry no staged Env");
    probe_env(&env)
}
