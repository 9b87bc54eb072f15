//! The preview that replaces an evicted result, and the numbered-line format it shares with
//! the read tool.

use std::fmt::Write as _;

use super::READ_TOOL;
use crate::text::clip_chars;

/// What the preview shows; copied from the layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Lines shown from the start.
    pub(crate) head: usize,
    /// Lines shown from the end.
    pub(crate) tail: usize,
    /// Characters shown of a line, at most.
    pub(crate) max_line_chars: usize,
    /// The read tool's default number of lines, named in the instructions.
    pub(crate) read_lines: usize,
}

/// The preview of `text`, stored whole at `path`: a header, the first and last lines
/// numbered like `cat -n`, a marker of what was left out, and how to read the rest.
///
/// Borrows `text`: nothing of it is copied but the lines shown.
pub(crate) fn render(text: &str, path: &str, tokens: usize, limit: usize, shape: Shape) -> String {
    // A final line break ends the last line; it does not start another.
    let body = text.strip_suffix('\n').unwrap_or(text);
    let total_lines = if text.is_empty() {
        0
    } else {
        body.matches('\n').count() + 1
    };
    let head = shape.head.min(total_lines);
    let tail = shape.tail.min(total_lines - head);
    let omitted = total_lines - head - tail;

    let total_chars = count_chars(text);

    let mut out = String::with_capacity(1024 + (head + tail) * shape.max_line_chars.min(200));
    let _ = write!(
        out,
        "[This result is too large for the context: about {tokens} tokens, over the limit of \
         {limit}. It was saved whole to {path} ({total_lines} lines, {total_chars} characters). "
    );
    if omitted == 0 {
        let _ = write!(out, "All its {total_lines} lines follow, numbered");
    } else {
        let _ = write!(
            out,
            "Its first {head} and last {tail} lines follow, numbered"
        );
    }
    let _ = writeln!(
        out,
        "; lines longer than {} characters are clipped.]",
        shape.max_line_chars
    );

    for (index, line) in body.split('\n').take(head).enumerate() {
        push_clipped(&mut out, index + 1, line, shape.max_line_chars);
    }
    if omitted > 0 {
        let head_end = match head {
            0 => 0,
            n => nth_line_break(body, n).map_or(text.len(), |i| i + 1),
        };
        let tail_start = tail_start(body, tail);
        // Counted around the omitted part, which may be most of the text.
        let omitted_chars =
            total_chars - count_chars(&text[..head_end]) - count_chars(&text[tail_start..]);
        let _ = writeln!(
            out,
            "[... {omitted} lines ({omitted_chars} characters) left out: lines {} to {} ...]",
            head + 1,
            total_lines - tail
        );
        let first_tail = total_lines - tail + 1;
        // No tail asked for: `split` of the empty rest would still give one empty line.
        let tail_lines = body[tail_start..].split('\n').take(tail);
        for (index, line) in tail_lines.enumerate() {
            push_clipped(&mut out, first_tail + index, line, shape.max_line_chars);
        }
    } else {
        for (index, line) in body.split('\n').skip(head).take(tail).enumerate() {
            push_clipped(&mut out, head + 1 + index, line, shape.max_line_chars);
        }
    }

    let next = if omitted > 0 { head + 1 } else { 1 };
    let _ = write!(
        out,
        "[To read it, call `{READ_TOOL}` with {{\"path\": \"{path}\", \"offset\": {next}, \
         \"limit\": {}}}: `offset` is the first line to show (1-based), `limit` how many lines \
         (default {}). Each reply says which lines it shows and the offset of the next slice.]",
        shape.read_lines, shape.read_lines
    );
    out
}

/// Append line `number` as `cat -n` shows it, clipped to `max_chars` characters with a
/// marker of what was cut.
pub(crate) fn push_clipped(out: &mut String, number: usize, line: &str, max_chars: usize) {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let (kept, more) = clip_chars(line, max_chars);
    push_line(out, number, kept, more, max_chars + 1);
}

/// Append line `number`, whose characters shown are `kept` and `more` characters were cut,
/// from column `next` (1-based) on.
pub(crate) fn push_line(out: &mut String, number: usize, kept: &str, more: usize, next: usize) {
    let _ = write!(out, "{number:>6}\t{kept}");
    if more > 0 {
        let s = if more == 1 { "" } else { "s" };
        let _ = write!(
            out,
            " [... line clipped: {more} more character{s}, from column {next}]"
        );
    }
    out.push('\n');
}

/// The characters of `text` (core counts them without decoding).
pub(crate) fn count_chars(text: &str) -> usize {
    text.chars().count()
}

/// The byte index of the `n`th (1-based) line break of `body`.
fn nth_line_break(body: &str, n: usize) -> Option<usize> {
    body.match_indices('\n').nth(n - 1).map(|(i, _)| i)
}

/// The byte index where the last `tail` lines of `body` start.
fn tail_start(body: &str, tail: usize) -> usize {
    if tail == 0 {
        return body.len();
    }
    body.rmatch_indices('\n')
        .nth(tail - 1)
        .map_or(0, |(i, _)| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_tail_shows_no_phantom_line() {
        let text: String = (1..=50).map(|i| format!("l{i}\n")).collect();
        let shape = Shape {
            head: 3,
            tail: 0,
            max_line_chars: 100,
            read_lines: 200,
        };
        let preview = render(&text, "/p", 99, 1, shape);
        assert!(preview.contains("     3\tl3\n[... 47 lines"), "{preview}");
        assert!(!preview.contains("    51\t"), "{preview}");
        assert!(!preview.contains("    50\t"), "{preview}");
    }

    const SHAPE: Shape = Shape {
        head: 2,
        tail: 2,
        max_line_chars: 5,
        read_lines: 200,
    };

    #[test]
    fn characters_are_counted_not_bytes() {
        assert_eq!(count_chars(""), 0);
        assert_eq!(count_chars("héllo"), 5);
        assert_eq!(count_chars("日本語🙂"), 4);
    }

    #[test]
    fn clipping_never_splits_a_character() {
        assert_eq!(clip_chars("abc", 5), ("abc", 0));
        assert_eq!(clip_chars("日本語日本語", 2), ("日本", 4));
        assert_eq!(clip_chars("ééééé", 5), ("ééééé", 0));
        assert_eq!(clip_chars("🙂🙂🙂", 0), ("", 3));
    }

    #[test]
    fn head_and_tail_are_numbered_around_the_omitted_lines() {
        let text = "a\nb\nc\nd\ne\nf\n";
        let preview = render(text, "/large_tool_results/t_1", 9, 1, SHAPE);
        assert!(preview.contains("(6 lines, 12 characters)"), "{preview}");
        assert!(
            preview.contains(
                "     1\ta\n     2\tb\n[... 2 lines (4 characters) left out: lines 3 to 4 ...]\n     5\te\n     6\tf\n"
            ),
            "{preview}"
        );
        assert!(preview.contains("\"offset\": 3"), "{preview}");
    }

    #[test]
    fn short_texts_show_every_line_and_clip_long_ones() {
        let preview = render("abcdefgh\r\nxy", "/p", 9, 1, SHAPE);
        assert!(preview.contains("All its 2 lines"), "{preview}");
        assert!(
            preview.contains(
                "     1\tabcde [... line clipped: 3 more characters, from column 6]\n     2\txy\n"
            ),
            "{preview}"
        );
        assert!(!preview.contains("left out"), "{preview}");
    }

    #[test]
    fn a_text_without_final_break_and_one_with_blank_lines() {
        let preview = render("1\n2\n3\n4\n5", "/p", 9, 1, SHAPE);
        assert!(preview.contains("lines 3 to 3"), "{preview}");
        assert!(preview.contains("     5\t5\n"), "{preview}");
        let preview = render("\n\n\n\n\n\n", "/p", 9, 1, SHAPE);
        assert!(preview.contains("(6 lines, 6 characters)"), "{preview}");
        assert!(preview.contains("     6\t\n"), "{preview}");
    }
}
