//! Workload generator (being written).
