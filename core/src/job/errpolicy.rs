//! fio's `continue_on_error` and `ignore_error`: which IO and verify errors a job counts and
//! survives instead of stopping at, with fio 3.33's rules (td_error.c, options.c):
//!
//! - an error is a *verify* error when its code is EILSEQ, otherwise a *read* or *write* error
//!   by the IO's direction (fio's `td_error_type`);
//! - `continue_on_error` says for which of those three kinds the job may go on, and only on
//!   the codes of that kind's list: EIO and EILSEQ unless `ignore_error` gives a list;
//! - `ignore_error=READ,WRITE,VERIFY` (lists of `:`-separated names or numbers) replaces the
//!   list of each kind it names and turns on going on for that kind; a later
//!   `continue_on_error` sets the kinds again, as in fio where the last option wins;
//! - every error of a kind the job goes on for is counted (`total_err`, `first_error`), also
//!   the one that finally stops it, as fio's `update_error_count` does.

use super::Direction;

/// fio's error kinds, in fio's bit order (`ERROR_TYPE_*_BIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Read = 0,
    Write = 1,
    Verify = 2,
}

const EIO: i32 = libc::EIO;
/// The code of a verify mismatch in fio (and in lockstep's reports).
pub const EILSEQ: i32 = libc::EILSEQ;

impl ErrorKind {
    /// fio's `td_error_type`.
    pub fn of(dir: Direction, errno: i32) -> ErrorKind {
        match (errno, dir) {
            (EILSEQ, _) => ErrorKind::Verify,
            (_, Direction::Read) => ErrorKind::Read,
            (_, Direction::Write) => ErrorKind::Write,
        }
    }
}

/// A job's `continue_on_error` and `ignore_error`. The default (fio's `none`) goes on after no
/// error at all, so a job stops at its first, as it always did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorPolicy {
    /// Bit `ErrorKind as u8`: the job goes on after errors of that kind.
    mask: u8,
    /// Per kind, the codes `ignore_error` gave; `None`: fio's EIO and EILSEQ.
    lists: [Option<Vec<i32>>; 3],
}

/// What a job counted of the errors it went on after (fio's `total_err_count` and
/// `first_error`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErrorCount {
    pub total: u64,
    /// The errno of the first counted error; 0 when none.
    pub first: i32,
}

impl ErrorCount {
    pub fn add(&mut self, errno: i32, n: u64) {
        if n > 0 && self.total == 0 {
            self.first = errno;
        }
        self.total += n;
    }

    /// Adds a merged member's counts: the first error is the first member's that had one.
    pub fn merge(&mut self, other: &ErrorCount) {
        self.add(other.first, other.total);
    }
}

const VALUES: &str = "none, read, write, io, verify, all, 0, 1";

impl ErrorPolicy {
    /// `continue_on_error=VALUE`, fio's names and its numeric aliases (fio refuses `true`,
    /// `yes`, other numbers and capitals, so lockstep does too).
    pub fn set_continue(&mut self, value: &str) -> Result<(), String> {
        self.mask = match value.trim() {
            "none" | "0" => 0,
            "read" => 1 << ErrorKind::Read as u8,
            "write" => 1 << ErrorKind::Write as u8,
            "io" => 1 << ErrorKind::Read as u8 | 1 << ErrorKind::Write as u8,
            "verify" => 1 << ErrorKind::Verify as u8,
            "all" | "1" => 0b111,
            _ => return Err(format!("expected one of {VALUES}")),
        };
        Ok(())
    }

    /// `ignore_error=READ_LIST,WRITE_LIST,VERIFY_LIST`; each list is `:`-separated error names
    /// (EIO, ENOSPC, ...) or numbers (decimal or 0x hex). An empty list leaves its kind as it
    /// was. fio stops reading a list at an empty element and takes `5x` as 5; lockstep refuses
    /// both, as it refuses an unknown name and a fourth list.
    pub fn set_ignore(&mut self, value: &str) -> Result<(), String> {
        let lists: Vec<&str> = value.trim().split(',').collect();
        if lists.len() > 3 {
            return Err(format!(
                "{} lists given; at most 3: reads, writes, verify (separated by ',')",
                lists.len()
            ));
        }
        let mut parsed: [Option<Vec<i32>>; 3] = Default::default();
        for (kind, list) in lists.iter().enumerate() {
            let list = list.trim();
            if list.is_empty() {
                continue;
            }
            let codes = list
                .split(':')
                .map(|e| parse_errno(e.trim()))
                .collect::<Result<Vec<i32>, String>>()?;
            parsed[kind] = Some(codes);
        }
        for (kind, codes) in parsed.into_iter().enumerate() {
            if let Some(codes) = codes {
                self.mask |= 1 << kind;
                self.lists[kind] = Some(codes);
            }
        }
        Ok(())
    }

    /// fio's `ts->continue_on_error`: the job was told to go on after some kind of error, so
    /// its report shows `total_err` and `first_error`.
    pub fn is_set(&self) -> bool {
        self.mask != 0
    }

    /// Whether a job with this policy goes on after `errno` (positive) of `kind` (fio's
    /// `td_non_fatal_error`).
    pub fn survives(&self, kind: ErrorKind, errno: i32) -> bool {
        if self.mask & (1 << kind as u8) == 0 {
            return false;
        }
        match &self.lists[kind as usize] {
            Some(codes) => codes.contains(&errno),
            None => errno == EIO || errno == EILSEQ,
        }
    }

    /// Decides about one failed IO and counts it as fio does: `true` when the job goes on.
    /// Errors of a kind the job does not go on for are not counted (fio returns before its
    /// count); the one that stops a job that goes on for its kind is.
    pub fn on_error(&self, count: &mut ErrorCount, kind: ErrorKind, errno: i32, n: u64) -> bool {
        if self.mask & (1 << kind as u8) == 0 {
            return false;
        }
        count.add(errno, n);
        self.survives(kind, errno)
    }

    /// The value for the report's "job options", in fio's spelling.
    pub fn continue_name(&self) -> &'static str {
        match self.mask {
            0 => "none",
            0b001 => "read",
            0b010 => "write",
            0b011 => "io",
            0b100 => "verify",
            0b111 => "all",
            // Only `ignore_error` combines kinds this way; fio prints its bits then.
            0b101 => "5",
            _ => "6",
        }
    }
}

/// An error name fio knows (its `str2error`: the Linux errno names) or a number.
fn parse_errno(s: &str) -> Result<i32, String> {
    let bad = || {
        format!("'{s}' is not an error: give a name such as EIO or ENOSPC, or a number (5, 0x1c)")
    };
    if s.starts_with('E') {
        return errno_by_name(s).ok_or_else(bad);
    }
    let n = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => i64::from_str_radix(hex, 16),
        None => s.trim_start_matches('-').parse::<i64>(),
    }
    .map_err(|_| bad())?;
    match i32::try_from(n) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(bad()),
    }
}

/// The names fio's `str2error` knows that lockstep's IOs can return, plus the common rest.
fn errno_by_name(name: &str) -> Option<i32> {
    use libc::*;
    Some(match name {
        "EPERM" => EPERM,
        "ENOENT" => ENOENT,
        "EINTR" => EINTR,
        "EIO" => EIO,
        "ENXIO" => ENXIO,
        "EBADF" => EBADF,
        "EAGAIN" | "EWOULDBLOCK" => EAGAIN,
        "ENOMEM" => ENOMEM,
        "EACCES" => EACCES,
        "EFAULT" => EFAULT,
        "EBUSY" => EBUSY,
        "EEXIST" => EEXIST,
        "EXDEV" => EXDEV,
        "ENODEV" => ENODEV,
        "ENOTDIR" => ENOTDIR,
        "EISDIR" => EISDIR,
        "EINVAL" => EINVAL,
        "ENFILE" => ENFILE,
        "EMFILE" => EMFILE,
        "ENOTTY" => ENOTTY,
        "ETXTBSY" => ETXTBSY,
        "EFBIG" => EFBIG,
        "ENOSPC" => ENOSPC,
        "ESPIPE" => ESPIPE,
        "EROFS" => EROFS,
        "EPIPE" => EPIPE,
        "ERANGE" => ERANGE,
        "EDEADLK" | "EDEADLOCK" => EDEADLK,
        "ENAMETOOLONG" => ENAMETOOLONG,
        "ENOLCK" => ENOLCK,
        "ENOSYS" => ENOSYS,
        "ENODATA" => ENODATA,
        "ETIME" => ETIME,
        "ENOLINK" => ENOLINK,
        "EPROTO" => EPROTO,
        "EBADMSG" => EBADMSG,
        "EOVERFLOW" => EOVERFLOW,
        "EILSEQ" => EILSEQ,
        "EOPNOTSUPP" => EOPNOTSUPP,
        "ENOBUFS" => ENOBUFS,
        "ENOTCONN" => ENOTCONN,
        "ETIMEDOUT" => ETIMEDOUT,
        "ECONNREFUSED" => ECONNREFUSED,
        "ECONNRESET" => ECONNRESET,
        "EHOSTDOWN" => EHOSTDOWN,
        "EHOSTUNREACH" => EHOSTUNREACH,
        "ESTALE" => ESTALE,
        "EUCLEAN" => EUCLEAN,
        "EREMOTEIO" => EREMOTEIO,
        "EDQUOT" => EDQUOT,
        "ENOMEDIUM" => ENOMEDIUM,
        "EMEDIUMTYPE" => EMEDIUMTYPE,
        "ECANCELED" => ECANCELED,
        "ENOTRECOVERABLE" => ENOTRECOVERABLE,
        "EHWPOISON" => EHWPOISON,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Direction::{Read, Write};

    fn policy(coe: &str) -> ErrorPolicy {
        let mut p = ErrorPolicy::default();
        p.set_continue(coe).unwrap();
        p
    }

    #[test]
    fn kinds_follow_fio_eilseq_is_verify_whatever_the_direction() {
        assert_eq!(ErrorKind::of(Read, EIO), ErrorKind::Read);
        assert_eq!(ErrorKind::of(Write, libc::ENOSPC), ErrorKind::Write);
        assert_eq!(ErrorKind::of(Write, EILSEQ), ErrorKind::Verify);
    }

    #[test]
    fn each_value_goes_on_after_its_kinds_only() {
        let cases = [
            ("none", [false, false, false]),
            ("0", [false, false, false]),
            ("read", [true, false, false]),
            ("write", [false, true, false]),
            ("io", [true, true, false]),
            ("verify", [false, false, true]),
            ("all", [true, true, true]),
            ("1", [true, true, true]),
        ];
        for (value, want) in cases {
            let p = policy(value);
            let got = [
                p.survives(ErrorKind::Read, EIO),
                p.survives(ErrorKind::Write, EIO),
                p.survives(ErrorKind::Verify, EILSEQ),
            ];
            assert_eq!(got, want, "continue_on_error={value}");
            assert_eq!(p.is_set(), want.contains(&true), "{value}");
        }
    }

    #[test]
    fn fio_refuses_these_spellings_so_lockstep_does() {
        for bad in ["true", "yes", "on", "2", "ALL", ""] {
            let e = ErrorPolicy::default().set_continue(bad).unwrap_err();
            assert!(
                e.contains("none, read, write, io, verify, all, 0, 1"),
                "{e}"
            );
        }
    }

    #[test]
    fn without_ignore_error_only_eio_and_eilseq_are_survived() {
        let p = policy("all");
        assert!(p.survives(ErrorKind::Write, EIO));
        assert!(!p.survives(ErrorKind::Write, libc::ENOSPC));
        assert!(!p.survives(ErrorKind::Read, libc::EINVAL));
    }

    #[test]
    fn a_fatal_error_of_a_covered_kind_is_counted_an_uncovered_one_is_not() {
        let p = policy("write");
        let mut c = ErrorCount::default();
        assert!(!p.on_error(&mut c, ErrorKind::Read, EIO, 1));
        assert_eq!(c, ErrorCount::default());
        assert!(p.on_error(&mut c, ErrorKind::Write, EIO, 1));
        assert!(!p.on_error(&mut c, ErrorKind::Write, libc::ENOSPC, 1));
        assert_eq!(
            c,
            ErrorCount {
                total: 2,
                first: EIO
            }
        );
    }

    #[test]
    fn ignore_error_replaces_a_kinds_list_and_turns_it_on() {
        // fio's own example: EAGAIN on reads, ENOSPC and 122 (EDQUOT) on writes.
        let mut p = ErrorPolicy::default();
        p.set_ignore("EAGAIN,ENOSPC:122").unwrap();
        assert!(p.survives(ErrorKind::Read, libc::EAGAIN));
        assert!(!p.survives(ErrorKind::Read, EIO), "the list replaces EIO");
        assert!(p.survives(ErrorKind::Write, libc::ENOSPC));
        assert!(p.survives(ErrorKind::Write, 122));
        assert!(
            !p.survives(ErrorKind::Verify, EILSEQ),
            "verify was not named"
        );
        // A later continue_on_error sets the kinds again; the lists stay.
        p.set_continue("none").unwrap();
        assert!(!p.survives(ErrorKind::Write, libc::ENOSPC));
        p.set_continue("write").unwrap();
        assert!(p.survives(ErrorKind::Write, libc::ENOSPC));
        let mut q = ErrorPolicy::default();
        q.set_ignore(",0x1c,").unwrap();
        assert!(q.survives(ErrorKind::Write, libc::ENOSPC));
        assert!(!q.survives(ErrorKind::Read, EIO));
    }

    #[test]
    fn malformed_lists_are_refused_with_the_reason() {
        for (bad, says) in [
            ("EIO,EIO,EIO,EIO", "at most 3"),
            ("ENOSPCX", "'ENOSPCX' is not an error"),
            (",5x", "'5x'"),
            ("EIO::ENOSPC", "'' is not an error"),
            ("0", "'0'"),
            ("eio", "'eio'"),
        ] {
            let e = ErrorPolicy::default().set_ignore(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn counts_keep_the_first_error_and_merge_in_order() {
        let mut a = ErrorCount::default();
        a.add(EIO, 0);
        assert_eq!(a.first, 0, "nothing counted, no first error");
        a.add(EILSEQ, 3);
        a.add(EIO, 1);
        assert_eq!(
            a,
            ErrorCount {
                total: 4,
                first: EILSEQ
            }
        );
        let mut g = ErrorCount::default();
        g.merge(&ErrorCount::default());
        g.merge(&ErrorCount {
            total: 2,
            first: EIO,
        });
        g.merge(&a);
        assert_eq!(
            g,
            ErrorCount {
                total: 6,
                first: EIO
            }
        );
    }
}
