//! Errors of the benchmark.

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A workload property is invalid: the error's field is the property.
    #[error("workload property `{}`: {}", .0.field, .0.message)]
    Workload(kv_stage::FieldError),
    /// A load profile is invalid.
    #[error("load profile '{spec}': {message}")]
    Profile {
        /// The profile spec.
        spec: String,
        /// What is wrong.
        message: String,
    },
    /// A command-line value is invalid.
    #[error("{0}")]
    Usage(String),
    /// RocksDB failed.
    #[error("rocksdb: {0}")]
    RocksDb(#[from] rocksdb::Error),
    /// rocks-env failed.
    #[error("{0}")]
    RocksEnv(#[from] rocks_env::Error),
    /// The stage failed.
    #[error("stage: {0}")]
    Stage(#[from] kv_stage::Error),
    /// The controller failed.
    #[error("controller: {0}")]
    Controller(#[from] controller::Error),
    /// Reading or writing files failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}
