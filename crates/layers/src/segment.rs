//! Storage path segments from names a model or a host chose (tool names, call ids, session
//! ids): never a way out of the root, never a failed write, never two names on one path.

/// `name` as one path segment: every character outside `[A-Za-z0-9_.-]` becomes `_`; when
/// anything was replaced, or the segment is longer than `max` bytes, it is shortened and a
/// stable hash of the original is appended, so two different names never share a segment.
/// Never empty, never `.` or `..`.
pub(crate) fn segment(name: &str, max: usize) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let changed = out != name || out.is_empty() || out.chars().all(|c| c == '.');
    if changed || out.len() > max {
        // ASCII only by now: any byte index is a character boundary.
        out.truncate(max.saturating_sub(17));
        if out.chars().all(|c| c == '.') {
            out = out.replace('.', "_");
        }
        out.push('-');
        out.push_str(&format!("{:016x}", fnv1a(name.as_bytes())));
    }
    out
}

/// FNV-1a, 64 bits: stable across Rust versions and platforms, unlike std's `DefaultHasher`.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_inside_one_segment() {
        assert_eq!(segment("call_1", 100), "call_1");
        for bad in ["../x", "a/b", "a\\b", "..", ".", "", "a\0b", "naïve", "a b"] {
            let s = segment(bad, 100);
            assert!(!s.contains(['/', '\\', '\0', ' ']), "{bad:?} -> {s}");
            assert!(s != "." && s != ".." && !s.is_empty(), "{bad:?} -> {s}");
            assert!(s.is_ascii(), "{bad:?} -> {s}");
        }
        assert_ne!(segment("a/b", 100), segment("a_b", 100), "no collision");
        let long = "x".repeat(300);
        assert!(segment(&long, 100).len() <= 100);
        assert_ne!(segment(&long, 100), segment(&"x".repeat(301), 100));
    }
}
