//! Coordinators as a service: one leads (etcd election), the others stand by and take over.
pub mod leader;
