//! Settings read from environment variables: a variable that is set must parse, and the error
//! names it.
use crate::base::error::{Error, OpKind, Result};

/// An error of opening the runtime: a setting that cannot be.
pub(crate) fn invalid(why: impl Into<String>) -> Error {
    Error::invalid(OpKind::Open, why)
}

/// Variable `name`'s value `v` (if set), parsed as `what`.
pub(crate) fn parse<T: std::str::FromStr>(name: &str, v: Option<String>, what: &str) -> Result<Option<T>> {
    v.map(|v| v.trim().parse().map_err(|_| invalid(format!("{name}={v}: want {what}")))).transpose()
}
