//! Normal (human) exporter (being written).
