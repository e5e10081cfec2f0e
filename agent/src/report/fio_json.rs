//! fio JSON exporter (being written).
