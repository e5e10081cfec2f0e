//! Runner (being written).
