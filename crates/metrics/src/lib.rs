//! Metrics for operators: the Prometheus text exposition format and a minimal HTTP endpoint
//! that serves it.
//!
//! | module | job |
//! |---|---|
//! | [`exposition`] | [`Exposition`]: metric families (HELP and TYPE lines, labelled samples) as text |
//! | [`http`] | [`serve`]: `GET /metrics` on a TCP address, from a thread of its own |
//!
//! The memnode (`gleaner memnode --metrics ADDR`), the node daemon (`gleaner node --metrics
//! ADDR`) and `gleaner status --prometheus` use it. The server is written on `std` rather than
//! taken from an HTTP crate: it answers one fixed path with one document, and a crate (hyper,
//! tiny_http) would bring a runtime or a dozen dependencies for that.
#![deny(missing_docs)]

pub mod exposition;
pub mod http;

pub use exposition::{Exposition, MetricType};
pub use http::{serve, MetricsServer};
