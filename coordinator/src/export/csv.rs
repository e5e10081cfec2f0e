//! The timeline as CSV: one row per volume and interval, for spreadsheets and plotting.

use std::fmt::Write;

use crate::results::RunResults;

pub const HEADER: &str = "t_ms,node,volume,role,read_iops,write_iops,read_mib_s,write_mib_s,errors,outstanding,lat_mean_us,lat_p50_us,lat_p99_us,lat_max_us";

pub fn timeline(r: &RunResults) -> String {
    let mut out = String::from(HEADER);
    out.push('\n');
    for v in &r.timeline.volumes {
        for p in &v.points {
            let secs = (p.len_ms.max(1)) as f64 / 1000.0;
            let _ = writeln!(
                out,
                "{},{},{},{},{:.1},{:.1},{:.3},{:.3},{},{:.2},{:.1},{:.1},{:.1},{:.1}",
                p.t_ms,
                v.node,
                v.volume,
                v.role,
                p.ios[0] as f64 / secs,
                p.ios[1] as f64 / secs,
                p.bytes[0] as f64 / secs / 1048576.0,
                p.bytes[1] as f64 / secs / 1048576.0,
                p.errors[0] + p.errors[1],
                p.outstanding,
                p.lat_mean_us,
                p.lat_p50_us,
                p.lat_p99_us,
                p.lat_max_us
            );
        }
    }
    out
}
