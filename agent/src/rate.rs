//! Rate scheduler (being written).
