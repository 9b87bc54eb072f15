//! Text helpers the layers share.

/// The first `max_chars` characters of `line` (never splitting one) and how many follow.
pub(crate) fn clip_chars(line: &str, max_chars: usize) -> (&str, usize) {
    // A line of at most `max_chars` bytes has at most that many characters.
    if line.len() <= max_chars {
        return (line, 0);
    }
    match line.char_indices().nth(max_chars) {
        Some((end, _)) => (&line[..end], line[end..].chars().count()),
        None => (line, 0),
    }
}
