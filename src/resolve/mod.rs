//! Request and connection facts to decisions.
#![warn(missing_docs)]
