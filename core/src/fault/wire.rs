//! The fault spec on the wire: `FaultSpec` to and from the protocol's typed `Fault` message
//! (`proto/proto/lockstep.proto`), in this one place. The coordinator encodes the spec its plan
//! built; the agent decodes and validates what it receives with `from_wire`, whose errors name
//! the fault (counted from 1) and the field.

use lockstep_proto::v1 as pb;
use lockstep_proto::v1::fault::Kind as PbKind;
use lockstep_proto::v1::latency_fault::Distribution as PbDistribution;

use super::spec::{
    BwCapSpec, CutOffSpec, Directions, DropWritesSpec, EbsSpec, EioSpec, ExecSpec, FaultError,
    FaultKind, FaultSpec, InstanceSpec, IopsCapSpec, KernelThrottleSpec, KillSpec,
    LatencyDistribution, LatencySpec, PauseSpec, SpecError, StallSpec, VolumeType, validate_all,
};

impl From<&FaultSpec> for pb::Fault {
    fn from(spec: &FaultSpec) -> Self {
        pb::Fault {
            at_ms: spec.at_ms,
            duration_ms: spec.duration_ms,
            kind: Some(kind_to_wire(&spec.kind)),
        }
    }
}

fn direction_to_wire(d: Directions) -> i32 {
    match d {
        Directions::Both => pb::FaultDirection::Both,
        Directions::Read => pb::FaultDirection::Read,
        Directions::Write => pb::FaultDirection::Write,
    }
    .into()
}

fn volume_type_to_wire(t: VolumeType) -> i32 {
    match t {
        VolumeType::Gp2 => pb::EbsVolumeType::Gp2,
        VolumeType::Gp3 => pb::EbsVolumeType::Gp3,
        VolumeType::Io1 => pb::EbsVolumeType::Io1,
        VolumeType::Io2 => pb::EbsVolumeType::Io2,
        VolumeType::St1 => pb::EbsVolumeType::St1,
        VolumeType::Sc1 => pb::EbsVolumeType::Sc1,
    }
    .into()
}

fn kind_to_wire(kind: &FaultKind) -> PbKind {
    match kind {
        FaultKind::IopsCap(c) => PbKind::IopsCap(pb::IopsCapFault {
            read: c.read,
            write: c.write,
            total: c.total,
        }),
        FaultKind::BwCap(c) => PbKind::BwCap(pb::BwCapFault {
            read_bytes_per_s: c.read_bytes_per_s,
            write_bytes_per_s: c.write_bytes_per_s,
            total_bytes_per_s: c.total_bytes_per_s,
        }),
        FaultKind::Ebs(e) => PbKind::Ebs(pb::EbsFault {
            volume_type: volume_type_to_wire(e.volume_type),
            size_gib: e.size_gib,
            provisioned_iops: e.provisioned_iops,
            provisioned_mib_s: e.provisioned_mib_s,
            time_scale: e.time_scale,
            initial_credit_fraction: e.initial_credit_fraction,
        }),
        FaultKind::Instance(i) => PbKind::Instance(pb::InstanceFault {
            instance_type: i.instance_type.clone(),
            baseline_mb_s: i.baseline_mb_s,
            baseline_iops: i.baseline_iops,
            maximum_mb_s: i.maximum_mb_s,
            maximum_iops: i.maximum_iops,
            time_scale: i.time_scale,
        }),
        FaultKind::Latency(l) => PbKind::Latency(pb::LatencyFault {
            add_us: l.add_us,
            distribution: l.distribution.map(|d| match d {
                LatencyDistribution::Uniform { min_us, max_us } => {
                    PbDistribution::Uniform(pb::UniformDelay { min_us, max_us })
                }
                LatencyDistribution::Exponential { mean_us } => {
                    PbDistribution::Exponential(pb::ExponentialDelay { mean_us })
                }
            }),
            fraction: l.fraction,
            direction: direction_to_wire(l.direction),
        }),
        FaultKind::Eio(e) => PbKind::Eio(pb::EioFault {
            fraction: e.fraction,
            direction: direction_to_wire(e.direction),
        }),
        FaultKind::Stall(_) => PbKind::Stall(pb::StallFault {}),
        FaultKind::DropWrites(d) => PbKind::DropWrites(pb::DropWritesFault {
            fraction: d.fraction,
        }),
        FaultKind::KernelThrottle(k) => PbKind::KernelThrottle(pb::KernelThrottleFault {
            riops: k.riops,
            wiops: k.wiops,
            rbps: k.rbps,
            wbps: k.wbps,
        }),
        FaultKind::Kill(_) => PbKind::Kill(pb::KillFault {}),
        FaultKind::Pause(_) => PbKind::Pause(pb::PauseFault {}),
        FaultKind::CutOff(_) => PbKind::CutOff(pb::CutOffFault {}),
        FaultKind::Exec(x) => PbKind::Exec(pb::ExecFault {
            start: x.start.clone(),
            end: x.end.clone(),
            timeout_ms: x.timeout_ms,
        }),
    }
}

/// A field the wire form cannot carry into a `FaultSpec` (a missing `kind`, an enum value
/// this build does not know).
fn malformed(kind: &'static str, field: &'static str, problem: &str) -> SpecError {
    SpecError {
        kind,
        field,
        problem: problem.to_string(),
    }
}

fn direction_from_wire(
    kind: &'static str,
    field: &'static str,
    d: i32,
) -> Result<Directions, SpecError> {
    match pb::FaultDirection::try_from(d) {
        Ok(pb::FaultDirection::Both) => Ok(Directions::Both),
        Ok(pb::FaultDirection::Read) => Ok(Directions::Read),
        Ok(pb::FaultDirection::Write) => Ok(Directions::Write),
        Err(_) => Err(malformed(
            kind,
            field,
            &format!("is {d}, not a direction (both 0, read 1, write 2)"),
        )),
    }
}

fn volume_type_from_wire(t: i32) -> Result<VolumeType, SpecError> {
    match pb::EbsVolumeType::try_from(t) {
        Ok(pb::EbsVolumeType::Gp2) => Ok(VolumeType::Gp2),
        Ok(pb::EbsVolumeType::Gp3) => Ok(VolumeType::Gp3),
        Ok(pb::EbsVolumeType::Io1) => Ok(VolumeType::Io1),
        Ok(pb::EbsVolumeType::Io2) => Ok(VolumeType::Io2),
        Ok(pb::EbsVolumeType::St1) => Ok(VolumeType::St1),
        Ok(pb::EbsVolumeType::Sc1) => Ok(VolumeType::Sc1),
        Ok(pb::EbsVolumeType::Unspecified) => Err(malformed(
            "ebs",
            "volume_type",
            "is missing (gp2, gp3, io1, io2, st1 or sc1)",
        )),
        Err(_) => Err(malformed(
            "ebs",
            "volume_type",
            &format!("is {t}, not a volume type this agent knows"),
        )),
    }
}

fn kind_from_wire(kind: PbKind) -> Result<FaultKind, SpecError> {
    Ok(match kind {
        PbKind::IopsCap(c) => FaultKind::IopsCap(IopsCapSpec {
            read: c.read,
            write: c.write,
            total: c.total,
        }),
        PbKind::BwCap(c) => FaultKind::BwCap(BwCapSpec {
            read_bytes_per_s: c.read_bytes_per_s,
            write_bytes_per_s: c.write_bytes_per_s,
            total_bytes_per_s: c.total_bytes_per_s,
        }),
        PbKind::Ebs(e) => FaultKind::Ebs(EbsSpec {
            volume_type: volume_type_from_wire(e.volume_type)?,
            size_gib: e.size_gib,
            provisioned_iops: e.provisioned_iops,
            provisioned_mib_s: e.provisioned_mib_s,
            time_scale: e.time_scale,
            initial_credit_fraction: e.initial_credit_fraction,
        }),
        PbKind::Instance(i) => FaultKind::Instance(InstanceSpec {
            instance_type: i.instance_type,
            baseline_mb_s: i.baseline_mb_s,
            baseline_iops: i.baseline_iops,
            maximum_mb_s: i.maximum_mb_s,
            maximum_iops: i.maximum_iops,
            time_scale: i.time_scale,
        }),
        PbKind::Latency(l) => FaultKind::Latency(LatencySpec {
            add_us: l.add_us,
            distribution: l.distribution.map(|d| match d {
                PbDistribution::Uniform(u) => LatencyDistribution::Uniform {
                    min_us: u.min_us,
                    max_us: u.max_us,
                },
                PbDistribution::Exponential(e) => {
                    LatencyDistribution::Exponential { mean_us: e.mean_us }
                }
            }),
            fraction: l.fraction,
            direction: direction_from_wire("latency", "direction", l.direction)?,
        }),
        PbKind::Eio(e) => FaultKind::Eio(EioSpec {
            fraction: e.fraction,
            direction: direction_from_wire("eio", "direction", e.direction)?,
        }),
        PbKind::Stall(_) => FaultKind::Stall(StallSpec {}),
        PbKind::DropWrites(d) => FaultKind::DropWrites(DropWritesSpec {
            fraction: d.fraction,
        }),
        PbKind::KernelThrottle(k) => FaultKind::KernelThrottle(KernelThrottleSpec {
            riops: k.riops,
            wiops: k.wiops,
            rbps: k.rbps,
            wbps: k.wbps,
        }),
        PbKind::Kill(_) => FaultKind::Kill(KillSpec {}),
        PbKind::Pause(_) => FaultKind::Pause(PauseSpec {}),
        PbKind::CutOff(_) => FaultKind::CutOff(CutOffSpec {}),
        PbKind::Exec(x) => FaultKind::Exec(ExecSpec {
            start: x.start,
            end: x.end,
            timeout_ms: x.timeout_ms,
        }),
    })
}

impl TryFrom<&pb::Fault> for FaultSpec {
    type Error = SpecError;

    /// The spec a message carries, not yet validated (`from_wire` does both).
    fn try_from(f: &pb::Fault) -> Result<Self, SpecError> {
        let kind = f.kind.clone().ok_or_else(|| {
            malformed(
                "?",
                "kind",
                "is missing (iops_cap, bw_cap, ebs, instance, latency, eio, stall, drop_writes, \
                 kernel_throttle, kill, pause, cut_off or exec)",
            )
        })?;
        Ok(FaultSpec {
            at_ms: f.at_ms,
            duration_ms: f.duration_ms,
            kind: kind_from_wire(kind)?,
        })
    }
}

/// A schedule as received: converted and validated, the first bad fault named by its position
/// and field ("fault 2 (ebs): volume_type is missing ...").
pub fn from_wire(faults: &[pb::Fault]) -> Result<Vec<FaultSpec>, FaultError> {
    let specs = faults
        .iter()
        .enumerate()
        .map(|(i, f)| {
            FaultSpec::try_from(f).map_err(|source| FaultError::Invalid {
                index: i + 1,
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    validate_all(&specs)?;
    Ok(specs)
}

/// A schedule for the wire.
pub fn to_wire(specs: &[FaultSpec]) -> Vec<pb::Fault> {
    specs.iter().map(pb::Fault::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One valid fault of every kind, with every optional field given somewhere.
    fn every_kind() -> Vec<FaultSpec> {
        let json = [
            r#"{"kind":"iops_cap","at_ms":5,"duration_ms":10,"read":1,"write":2,"total":3}"#,
            r#"{"kind":"bw_cap","read_bytes_per_s":4096,"write_bytes_per_s":8192,"total_bytes_per_s":9000}"#,
            r#"{"kind":"ebs","volume_type":"gp3","size_gib":100,"provisioned_iops":4000,"provisioned_mib_s":200,"time_scale":60.0,"initial_credit_fraction":0.5}"#,
            r#"{"kind":"ebs","volume_type":"sc1","size_gib":500}"#,
            r#"{"kind":"latency","add_us":1000,"fraction":0.5,"direction":"read"}"#,
            r#"{"kind":"latency","distribution":{"type":"uniform","min_us":10,"max_us":20}}"#,
            r#"{"kind":"latency","distribution":{"type":"exponential","mean_us":30},"direction":"write"}"#,
            r#"{"kind":"eio","fraction":0.1,"direction":"write"}"#,
            r#"{"kind":"stall","at_ms":100,"duration_ms":100}"#,
            r#"{"kind":"drop_writes","fraction":0.25}"#,
            r#"{"kind":"kernel_throttle","riops":1,"wiops":2,"rbps":4096,"wbps":8192}"#,
            r#"{"kind":"kill","at_ms":1000}"#,
            r#"{"kind":"pause","at_ms":1000,"duration_ms":500}"#,
            r#"{"kind":"cut_off","at_ms":50,"duration_ms":300}"#,
            r#"{"kind":"exec","duration_ms":10,"start":"true","end":"false","timeout_ms":1000}"#,
            r#"{"kind":"instance","type":"m5.large","time_scale":60.0}"#,
            r#"{"kind":"instance","baseline_mb_s":87.5,"baseline_iops":500,"maximum_mb_s":100.25,"maximum_iops":900}"#,
        ];
        json.iter()
            .map(|j| serde_json::from_str(j).unwrap_or_else(|e| panic!("{j}: {e}")))
            .collect()
    }

    #[test]
    fn every_kind_survives_the_wire_unchanged() {
        let specs = every_kind();
        validate_all(&specs).unwrap();
        assert_eq!(from_wire(&to_wire(&specs)).unwrap(), specs);
    }

    #[test]
    fn a_message_without_a_kind_is_refused_with_its_position() {
        let mut wire = to_wire(&every_kind());
        wire[1].kind = None;
        let e = from_wire(&wire).unwrap_err().to_string();
        assert!(e.starts_with("fault 2 (?): kind is missing"), "{e}");
    }

    #[test]
    fn unknown_enum_values_name_their_field() {
        let mut wire = to_wire(&every_kind());
        let Some(PbKind::Ebs(e)) = &mut wire[2].kind else {
            panic!("ebs expected")
        };
        e.volume_type = 0;
        let msg = from_wire(&wire).unwrap_err().to_string();
        assert!(
            msg.starts_with("fault 3 (ebs): volume_type is missing"),
            "{msg}"
        );
        let Some(PbKind::Ebs(e)) = &mut wire[2].kind else {
            unreachable!()
        };
        e.volume_type = 99;
        let msg = from_wire(&wire).unwrap_err().to_string();
        assert!(msg.contains("volume_type is 99"), "{msg}");
        let Some(PbKind::Eio(e)) = &mut wire[7].kind else {
            panic!("eio expected")
        };
        e.direction = 7;
        wire[2] = pb::Fault::from(&every_kind()[2]);
        let msg = from_wire(&wire).unwrap_err().to_string();
        assert!(msg.starts_with("fault 8 (eio): direction is 7"), "{msg}");
    }

    #[test]
    fn values_are_validated_on_receipt() {
        let mut wire = to_wire(&every_kind()[..1]);
        wire.push(pb::Fault {
            at_ms: 0,
            duration_ms: None,
            kind: Some(PbKind::DropWrites(pb::DropWritesFault {
                fraction: f64::NAN,
            })),
        });
        let msg = from_wire(&wire).unwrap_err().to_string();
        assert!(msg.starts_with("fault 2 (drop_writes): fraction"), "{msg}");
    }
}
