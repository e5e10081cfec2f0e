//! Chokepoint analysis (being written).
