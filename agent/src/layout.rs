//! Target layout (being written).
