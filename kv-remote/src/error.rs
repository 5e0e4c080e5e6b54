//! Errors of the remote control plane.

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An endpoint could not be read.
    #[error("endpoint '{endpoint}': {message}")]
    Endpoint {
        /// The text given.
        endpoint: String,
        /// What is wrong with it.
        message: String,
    },
    /// An agent could not start.
    #[error("agent: {0}")]
    Agent(String),
    /// A stage could not be reached, or refused a call.
    #[error("stage at {endpoint}: {message}")]
    Remote {
        /// Where.
        endpoint: String,
        /// The gRPC status (code and message) or transport error.
        message: String,
    },
    /// A metrics endpoint could not start (a refused address, a port in
    /// use).
    #[error("metrics: {0}")]
    Metrics(String),
    /// A fleet file is invalid (the key is named).
    #[error("{path}: {message}")]
    Fleet {
        /// The file.
        path: String,
        /// What is wrong, naming the key.
        message: String,
    },
    /// etcd could not be reached, or a key's value is invalid (named).
    #[error("etcd {key}: {message}")]
    Etcd {
        /// The key (or the endpoints, for a connection).
        key: String,
        /// What went wrong.
        message: String,
    },
}
