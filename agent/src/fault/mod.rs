//! Faults in the IO path (being written).
