//! fio job files (being written).
