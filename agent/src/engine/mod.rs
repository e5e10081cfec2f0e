//! Engines (being written).
