//! Errors of the controller.

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is invalid: the error's field is the key
    /// (`silk.min_bandwidth`, `fair_share.instance[1].demand`).
    #[error("config key `{}`: {}", .0.field, .0.message)]
    Config(kv_stage::FieldError),
    /// A policy failed in a cycle (the previous rates stay; no rate of
    /// that cycle is applied).
    #[error("policy {policy}: {error}")]
    Policy {
        /// The policy's name.
        policy: &'static str,
        /// What happened.
        error: crate::policy::PolicyError,
    },
    /// Writing the decision log failed.
    #[error("decision log: {0}")]
    Log(#[from] std::io::Error),
}

impl Error {
    pub(crate) fn config(key: &str, message: impl Into<String>) -> Self {
        Error::Config(kv_stage::FieldError::new(key, message))
    }
}
