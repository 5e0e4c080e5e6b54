//! Layer-oriented wrappers: replace an original call with a staged one.
//!
//! * [`StagedFile`]: a `std::fs::File` whose reads, writes and syncs are
//!   enforced first (implements `Read`, `Write`, `Seek`).
//! * [`KvStore`] and [`StagedKv`]: a key-value interface whose puts, gets,
//!   deletes and scans are enforced first. `rocks-env` implements [`KvStore`]
//!   for RocksDB; [`MemKv`] is an in-memory store for examples and tests.
//!
//! Both keep the wrapped call's order and errors: the request is enforced,
//! then carried out on the same thread; a failed enforcement is returned as
//! an `io::Error` and the call is not made.

mod file;
mod kv;

pub use file::{StagedFile, remove_file, rename};
pub use kv::{KvStore, MemKv, StagedKv};
