//! Errors of rocks-env.

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong opening or configuring a staged DB.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// RocksDB refused (open, a column family, a write).
    #[error("rocksdb: {0}")]
    RocksDb(#[from] rocksdb::Error),
    /// The stage refused a layout or rule.
    #[error("stage: {0}")]
    Stage(#[from] kv_stage::Error),
    /// A configuration value is invalid (the message names it).
    #[error("{0}")]
    Config(String),
    /// The DB directory is locked: already open, in this process or in
    /// another one (RocksDB's `LOCK` file).
    #[error("{path}: the DB is already open {by} (rocksdb: {source})")]
    Locked {
        /// The DB directory.
        path: std::path::PathBuf,
        /// "in this process" or "by another process".
        by: &'static str,
        /// RocksDB's own error.
        source: rocksdb::Error,
    },
}

impl Error {
    /// RocksDB's error opening `path`, told apart when it is the lock.
    pub(crate) fn opening(path: &std::path::Path, e: rocksdb::Error) -> Self {
        let text = e.to_string();
        let by = if text.contains("lock hold by current process") {
            "in this process"
        } else if text.contains("While lock file") || text.contains("/LOCK:") {
            "by another process"
        } else {
            return Error::RocksDb(e);
        };
        Error::Locked { path: path.to_owned(), by, source: e }
    }
}
