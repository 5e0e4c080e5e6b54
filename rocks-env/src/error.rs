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
}
