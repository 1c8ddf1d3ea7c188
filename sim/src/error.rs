//! The one error type of the software HCA and the scripted device: a negative errno for C callers and a message
//! for people, as sqdisc's own.

use std::borrow::Cow;
use std::fmt;

/// A failed operation. `errno()` is the positive errno value (`libc::EINVAL`, ...); the C API returns its
/// negation. The message names the argument or the numbers involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    errno: i32,
    message: Cow<'static, str>,
}

impl Error {
    pub fn new(errno: i32, message: impl Into<Cow<'static, str>>) -> Error {
        Error { errno, message: message.into() }
    }
    pub fn invalid(message: impl Into<Cow<'static, str>>) -> Error {
        Error::new(libc::EINVAL, message)
    }
    pub fn errno(&self) -> i32 {
        self.errno
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno)
    }
}

impl std::error::Error for Error {}

/// A refusal of the device registry (`sqdisc-device`) when a device registers: its errno and message.
impl From<sqdisc_device::Error> for Error {
    fn from(e: sqdisc_device::Error) -> Error {
        Error::new(e.errno(), e.message().to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
