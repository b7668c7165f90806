//! raw
