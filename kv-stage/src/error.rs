//! Errors. Control-path errors ([`Error`]) say what was wrong and where: the
//! rules file and line, the rule id, the field, the channel or object.
//! Data-path errors ([`EnforceError`]) are cheap to build and convert into
//! `std::io::Error` for layers that speak I/O.

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// Result alias for control-path operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a rule came from, for error messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Location {
    /// File (or other source) the rule was read from.
    pub source: Option<Arc<str>>,
    /// 1-based line in that file, when known.
    pub line: Option<usize>,
    /// 0-based position of the rule in its batch.
    pub index: usize,
    /// The rule's own id, when it has one.
    pub id: Option<u64>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.source, self.line) {
            (Some(s), Some(l)) => write!(f, "{s}:{l}")?,
            (None, Some(l)) => write!(f, "line {l}")?,
            (Some(s), None) => write!(f, "{s}: rules[{}]", self.index)?,
            (None, None) => write!(f, "rules[{}]", self.index)?,
        }
        if let Some(id) = self.id {
            write!(f, " (rule id {id})")?;
        }
        Ok(())
    }
}

/// A control-path error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A rule is malformed or does not fit the stage; nothing was applied.
    #[error("{location}: {}{message}", field.as_ref().map(|f| format!("field `{f}`: ")).unwrap_or_default())]
    Rule {
        /// Where the rule is.
        location: Location,
        /// The field at fault, when one is.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// A value outside any rule is invalid (a name, a rate, a layout limit).
    #[error("{0}")]
    Invalid(String),
    /// Reading a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::Invalid(msg.into())
    }

    pub(crate) fn rule(location: &Location, field: Option<&str>, message: impl Into<String>) -> Self {
        Error::Rule { location: location.clone(), field: field.map(str::to_owned), message: message.into() }
    }

    /// The location of a rule error.
    pub fn location(&self) -> Option<&Location> {
        match self {
            Error::Rule { location, .. } => Some(location),
            _ => None,
        }
    }

    /// The field named by a rule error.
    pub fn field(&self) -> Option<&str> {
        match self {
            Error::Rule { field, .. } => field.as_deref(),
            _ => None,
        }
    }
}

/// Why an enforcement object did not admit a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// The stage (or the object) was shut down while the request waited.
    ShutDown,
    /// The object refused the request.
    Failed(Cow<'static, str>),
}

/// What kind of enforcement failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EnforceErrorKind {
    /// The stage (or the object) is shut down.
    ShutDown,
    /// An enforcement object refused the request.
    Refused,
}

#[derive(Debug, Clone)]
struct EnforceErrorInner {
    kind: EnforceErrorKind,
    object: Option<Arc<str>>,
    reason: Cow<'static, str>,
}

/// A request could not be enforced. The request must not be carried out;
/// layers turn this into an I/O error for their caller.
///
/// Boxed (one word) so that `Result<Outcome, EnforceError>` is no larger
/// than `Outcome` itself (40 bytes; `tests/sizes.rs` holds both); the box
/// is only allocated when a request fails.
#[derive(Debug, Clone)]
pub struct EnforceError(Box<EnforceErrorInner>);

impl EnforceError {
    pub(crate) fn shut_down(object: Option<&Arc<str>>) -> Self {
        EnforceError(Box::new(EnforceErrorInner {
            kind: EnforceErrorKind::ShutDown,
            object: object.cloned(),
            reason: Cow::Borrowed("stage is shut down"),
        }))
    }

    pub(crate) fn from_rejection(object: &Arc<str>, r: Rejection) -> Self {
        match r {
            Rejection::ShutDown => Self::shut_down(Some(object)),
            Rejection::Failed(reason) => EnforceError(Box::new(EnforceErrorInner {
                kind: EnforceErrorKind::Refused,
                object: Some(Arc::clone(object)),
                reason,
            })),
        }
    }

    /// What kind of failure.
    pub fn kind(&self) -> EnforceErrorKind {
        self.0.kind
    }

    /// `channel/object` that failed the request, when one did.
    pub fn object(&self) -> Option<&str> {
        self.0.object.as_deref()
    }

    /// Why.
    pub fn reason(&self) -> &str {
        &self.0.reason
    }
}

impl fmt::Display for EnforceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0.kind, &self.0.object) {
            (EnforceErrorKind::ShutDown, Some(o)) => write!(f, "stage is shut down (object {o})"),
            (EnforceErrorKind::ShutDown, None) => f.write_str("stage is shut down"),
            (EnforceErrorKind::Refused, Some(o)) => {
                write!(f, "enforcement object {o} refused the request: {}", self.0.reason)
            }
            (EnforceErrorKind::Refused, None) => write!(f, "the request was refused: {}", self.0.reason),
        }
    }
}

impl std::error::Error for EnforceError {}

/// An I/O error of a kind a caller can match on, holding the
/// [`EnforceError`] (`get_ref()?.downcast_ref::<EnforceError>()` for its
/// object and reason): a refusal is `PermissionDenied`, a shut-down stage
/// `ConnectionAborted` (never `Interrupted`, which callers retry).
impl From<EnforceError> for std::io::Error {
    fn from(e: EnforceError) -> Self {
        let kind = match e.kind() {
            EnforceErrorKind::ShutDown => std::io::ErrorKind::ConnectionAborted,
            EnforceErrorKind::Refused => std::io::ErrorKind::PermissionDenied,
        };
        std::io::Error::new(kind, e)
    }
}

/// "This field (a key, a setting, a column of a line) was wrong": the one
/// error for a bad value anywhere a value has a name: an object's settings,
/// an `io.max` key, a device number. Shown as `field: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// The field at fault (for a token that is not `key=value`, the token).
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// The field does not exist at all (an object has no such setting), as
    /// opposed to a bad value for one that does.
    pub unsupported: bool,
}

impl FieldError {
    /// A bad value for a field that exists.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError { field: field.into(), message: message.into(), unsupported: false }
    }

    /// A field that does not exist.
    pub fn unsupported(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError { field: field.into(), message: message.into(), unsupported: true }
    }
}
