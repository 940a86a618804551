//! Executor failures, each carrying its wire code.

use iii_shell_protocol::error::{escape_message, not_found_message};
use iii_shell_protocol::{Code, WireError};

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// S210: the request is invalid.
    #[error("{0}")]
    Invalid(String),
    /// S211: missing or denied; one wording for both.
    #[error("{}", not_found_message(.0))]
    NotFound(String),
    /// S215: the path escapes the jail.
    #[error("{}", escape_message(.0))]
    Escape(String),
    /// A plain-message failure (argv, denylist, job limits): code `invocation_failed`.
    #[error("{0}")]
    Plain(String),
    /// S211 with a message of its own (e.g. "no such job").
    #[error("{0}")]
    Missing(String),
    /// S212: wrong file type for the operation.
    #[error("{0}")]
    WrongType(String),
    /// S213: the path already exists.
    #[error("already exists: {0}")]
    Exists(String),
    /// S214: the directory is not empty.
    #[error("directory not empty: {0}")]
    NotEmpty(String),
    /// S217: the regex does not compile.
    #[error("{0}")]
    BadRegex(String),
    /// S218: a size cap was exceeded.
    #[error("{0}")]
    TooLarge(String),
    /// S216: an internal failure (spawn error, signal delivery, …).
    #[error("{0}")]
    Internal(String),
    /// S220: the path lies outside the call's `fs_scope.scope_root` (the full message).
    #[error("{0}")]
    OutOfScope(String),
}

impl ExecError {
    pub fn code(&self) -> Code {
        match self {
            ExecError::Invalid(_) => Code::S210,
            ExecError::NotFound(_) | ExecError::Missing(_) => Code::S211,
            ExecError::Escape(_) => Code::S215,
            ExecError::Plain(_) => Code::InvocationFailed,
            ExecError::WrongType(_) => Code::S212,
            ExecError::Exists(_) => Code::S213,
            ExecError::NotEmpty(_) => Code::S214,
            ExecError::BadRegex(_) => Code::S217,
            ExecError::TooLarge(_) => Code::S218,
            ExecError::Internal(_) => Code::S216,
            ExecError::OutOfScope(_) => Code::S220,
        }
    }

    pub fn to_wire(&self) -> WireError {
        WireError::new(self.code(), self.to_string())
    }
}

impl From<ExecError> for WireError {
    fn from(e: ExecError) -> Self {
        e.to_wire()
    }
}

impl From<iii_shell_policy::PolicyError> for ExecError {
    fn from(e: iii_shell_policy::PolicyError) -> Self {
        match e {
            iii_shell_policy::PolicyError::Invalid(m) => ExecError::Invalid(m),
            iii_shell_policy::PolicyError::Plain(m) => ExecError::Plain(m),
        }
    }
}

impl From<iii_shell_policy::command::CommandError> for ExecError {
    fn from(e: iii_shell_policy::command::CommandError) -> Self {
        use iii_shell_policy::command::CommandError;
        match e {
            CommandError::Rule(p) => p.into(),
            denied @ CommandError::Denied { .. } => ExecError::Plain(denied.to_string()),
        }
    }
}
