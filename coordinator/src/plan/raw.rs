//! The plan as written: serde structs that mirror the TOML, with spans kept for messages.
//!
//! Unknown keys are errors everywhere (a misspelt `iodepht` must not be silently ignored),
//! except in `[[fault]]`, whose extra keys are the agent's FaultSpec and are checked against it.
//! Checks that need more than one key (a profile that exists, a phase a fault refers to) are
//! made in `mod.rs`; this file only decides the shape.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlan {
    pub name: Option<Spanned<String>>,
    pub duration: Option<Spanned<Dur>>,
    pub interval: Option<Spanned<Dur>>,
    /// Signed, so a negative value gets lockstep's message rather than serde's.
    pub histogram_digits: Option<Spanned<i64>>,
    pub ramp: Option<Spanned<Dur>>,
    #[serde(default)]
    pub agent: Vec<Spanned<RawAgent>>,
    #[serde(default)]
    pub role: Vec<Spanned<RawRole>>,
    #[serde(default)]
    pub phase: Vec<Spanned<RawPhase>>,
    #[serde(default)]
    pub objective: Vec<Spanned<RawObjective>>,
    #[serde(default)]
    pub fault: Vec<Spanned<RawFault>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAgent {
    pub name: Spanned<String>,
    pub address: Spanned<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRole {
    pub name: Spanned<String>,
    pub select: Option<Spanned<RawSelect>>,
    pub volumes: Option<Spanned<Vec<String>>>,
    pub workload: Spanned<RawWorkload>,
    pub rate_iops: Option<Spanned<u64>>,
    pub rate_curve: Option<Spanned<Vec<f64>>>,
    /// Signed, so a 0 or a negative value gets lockstep's message rather than serde's.
    pub depth_sweep: Option<Spanned<Vec<i64>>>,
    pub sweep_over: Option<Spanned<String>>,
    pub mirror: Option<Spanned<RawMirror>>,
    /// `sweep = { over = "volumes", values = [4, 5, 6] }`.
    pub sweep: Option<Spanned<RawSweep>>,
}

/// `mirror = { to = "backup", mode = "sync", delay_us = 1100, failover_after = "2s" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMirror {
    pub to: String,
    pub mode: Option<String>,
    pub delay_us: Option<u64>,
    pub failover_after: Option<Dur>,
    pub catch_up: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSweep {
    pub over: String,
    /// Signed, so a 0 or a negative value gets lockstep's message rather than serde's.
    pub values: Vec<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSelect {
    pub agents: Option<Vec<String>>,
    pub labels: Option<BTreeMap<String, String>>,
}

/// Exactly one of `profile`, `jobfile`, `fio`; `set` overrides options of any of them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorkload {
    pub profile: Option<Spanned<String>>,
    pub jobfile: Option<Spanned<String>>,
    pub fio: Option<Spanned<FioOptions>>,
    pub set: Option<Spanned<FioOptions>>,
}

/// fio options as TOML: `rw = "randrw"`, `iodepth = 16`, `direct = true`.
pub(super) type FioOptions = BTreeMap<String, Spanned<toml::Value>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPhase {
    pub name: Spanned<String>,
    pub duration: Option<Spanned<Dur>>,
    pub measure: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawObjective {
    pub metric: Spanned<String>,
    pub direction: Option<RawDirection>,
    /// A latency with its unit (latency metrics).
    pub below: Option<Spanned<toml::Value>>,
    /// A number (throughput metrics).
    pub above: Option<Spanned<toml::Value>>,
    pub scope: Option<RawScope>,
    pub role: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawDirection {
    Read,
    Write,
    Any,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawScope {
    Volume,
    Node,
    Cluster,
}

/// A `[[fault]]` table: lockstep's keys plus the FaultSpec's, told apart in `mod.rs`.
pub(super) type RawFault = BTreeMap<String, Spanned<toml::Value>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTarget {
    pub agents: Option<Vec<String>>,
    pub labels: Option<BTreeMap<String, String>>,
    pub role: Option<String>,
    pub volumes: Option<Vec<String>>,
}

/// A duration written with its unit (`"60s"`, `"1m30s"`, `"250ms"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Dur;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a duration with its unit, e.g. \"30s\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Dur, E> {
                super::parse_duration(s).map(Dur).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "give the unit as a string, e.g. \"{v}s\" or \"{v}ms\""
                )))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Dur, E> {
                self.visit_i64(v as i64)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "give the unit as a string, e.g. \"{v}s\""
                )))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The element and key a byte offset of the plan belongs to, as messages name them:
/// `role 'worker': workload.fio`, `fault #2: target`, `duration`. Empty when the text does not
/// parse as TOML at all (the syntax error's line is then all there is to say).
///
/// A key is included when the offset is inside its value; an unknown key's own span stops the
/// path at its parent, so "unknown field `iodepht`" is reported for `role 'x': workload.fio`.
pub(super) fn field_at(text: &str, offset: usize) -> String {
    let Ok(doc) = DeTable::parse(text) else {
        return String::new();
    };
    let mut path = String::new();
    for (key, value) in doc.get_ref().iter() {
        let key_name = key.get_ref().as_ref();
        let tables = match value.get_ref() {
            DeValue::Array(items)
                if !items.is_empty()
                    && items
                        .iter()
                        .all(|i| matches!(i.get_ref(), DeValue::Table(_))) =>
            {
                Some(items)
            }
            _ => None,
        };
        if let Some(items) = tables {
            for (index, item) in items.iter().enumerate() {
                let DeValue::Table(table) = item.get_ref() else {
                    continue;
                };
                if !contains(&extent(item), offset) {
                    continue;
                }
                let name = table.get("name").and_then(|n| n.get_ref().as_str());
                path = super::label(key_name, name, index);
                if let Some(inner) = inner_path(table, offset) {
                    path.push_str(": ");
                    path.push_str(&inner);
                }
                return path;
            }
            if contains(&key.span(), offset) || contains(&extent(value), offset) {
                return key_name.to_string();
            }
            continue;
        }
        if contains(&extent(value), offset) {
            path = key_name.to_string();
            if let Some(inner) = table_path(value, offset) {
                path.push('.');
                path.push_str(&inner);
            }
            return path;
        }
        if contains(&key.span(), offset) {
            return key_name.to_string();
        }
    }
    path
}

/// The line with the most nesting (dots of dotted keys, opening brackets and braces, outside
/// strings), as the byte offset of its start, and the first key on it. For the one error the
/// TOML crate gives without a position (its recursion limit, reached by a long dotted key such
/// as `a.a.a...a = 1` or by deeply nested arrays), so the message still names a line. Done on
/// the text because the TOML parser refuses such a document before there is a tree to walk.
pub(super) fn most_nested_line(text: &str) -> Option<(usize, String)> {
    let mut best: Option<(usize, usize, &str)> = None;
    let mut offset = 0;
    // A string may not span lines here: multi-line strings only make the count smaller.
    for line in text.split_inclusive('\n') {
        let mut quote: Option<char> = None;
        let mut nesting = 0;
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') => break,
                (None, '.' | '[' | '{') => nesting += 1,
                _ => {}
            }
        }
        if nesting > 0 && best.is_none_or(|(n, _, _)| nesting > n) {
            best = Some((nesting, offset, line));
        }
        offset += line.len();
    }
    best.map(|(_, offset, line)| {
        let key = line
            .trim_start()
            .trim_start_matches('[')
            .split(['.', '=', ']', ' ', '\t'])
            .next()
            .unwrap_or_default()
            .trim_matches(['"', '\''])
            .to_string();
        (offset, key)
    })
}

/// Dotted path of keys inside `table` whose values contain `offset`.
fn inner_path(table: &DeTable, offset: usize) -> Option<String> {
    for (key, value) in table.iter() {
        if !contains(&extent(value), offset) {
            continue;
        }
        let mut path = key.get_ref().to_string();
        if let Some(rest) = table_path(value, offset) {
            path.push('.');
            path.push_str(&rest);
        }
        return Some(path);
    }
    None
}

/// `inner_path` of a value that is a table; `None` for other values.
fn table_path(value: &Spanned<DeValue>, offset: usize) -> Option<String> {
    match value.get_ref() {
        DeValue::Table(table) => inner_path(table, offset),
        _ => None,
    }
}

/// The text a value covers, including its nested keys: for tables opened by a `[header]` the
/// value's own span is only the header.
fn extent(value: &Spanned<DeValue>) -> Range<usize> {
    let mut r = value.span();
    match value.get_ref() {
        DeValue::Table(t) => {
            for (k, v) in t.iter() {
                r = union(r, k.span());
                r = union(r, extent(v));
            }
        }
        DeValue::Array(a) => {
            for v in a.iter() {
                r = union(r, extent(v));
            }
        }
        _ => {}
    }
    r
}

fn union(a: Range<usize>, b: Range<usize>) -> Range<usize> {
    a.start.min(b.start)..a.end.max(b.end)
}

/// Whether `r` covers `offset` (an empty span covers its own position).
fn contains(r: &Range<usize>, offset: usize) -> bool {
    r.contains(&offset) || (r.is_empty() && r.start == offset)
}
