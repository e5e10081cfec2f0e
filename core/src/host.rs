//! This machine's name, as agents register it and coordinators sign their leadership with.

/// The host name from `gethostname(2)`, or "localhost" if it cannot be read.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_this_host() {
        let name = super::hostname();
        assert!(!name.is_empty() && !name.contains('\0'), "{name:?}");
    }
}
