//! fio number syntax (being written).
