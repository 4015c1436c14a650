//! What reached user space and could not be used.

/// Events that reached user space, and those that could not be used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Losses {
    /// Events decoded and handled.
    pub handled: u64,
    /// Header or body shorter than its kind needs.
    pub malformed: u64,
    /// A `kind` value this gostw does not know (a newer kernel object).
    pub unknown_kind: u64,
    /// A known kind that this trace does not follow (e.g. a fault event while
    /// faults are not traced).
    pub unhandled: u64,
}

impl Losses {
    /// Events that reached user space but produced nothing.
    pub fn lost(&self) -> u64 {
        self.malformed + self.unknown_kind + self.unhandled
    }
}
