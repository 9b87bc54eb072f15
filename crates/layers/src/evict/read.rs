//! The read tool: numbered slices of a stored result, read as a stream.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::StreamExt;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{Error, RunContext, ToolCall, ToolRequest, ToolResponse, ToolSpec};
use tower_agent_storage::{ByteStream, StoragePath};
use tower_agent_tools::{FnTool, ResponseFuture, Tool, ToolHandler, tool_fn};
use tower_service::Service;

use super::path::{DIR, parse_result_path};
use super::preview::push_line;
use super::{Config, READ_TOOL};
use crate::text::clip_chars;

// The doc comments of the fields are what the model reads (the tool's JSON schema).
/// The arguments of the read tool: which stored result, and which lines of it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(description = "Which stored tool result to read, and which lines of it.")]
pub struct ReadArgs {
    /// The path the preview of the result named, e.g. `/large_tool_results/search_call_1`.
    pub path: String,
    /// The first line to show, counting from 1 (default 1).
    #[serde(default)]
    pub offset: Option<usize>,
    /// How many lines to show (default 200).
    #[serde(default)]
    pub limit: Option<usize>,
    /// The character of the first line to start at, counting from 1 (default 1): to read on
    /// in a line that was clipped (a marker names the column).
    #[serde(default)]
    pub column: Option<usize>,
}

/// The read tool of an [`EvictLayer`](super::EvictLayer), named [`READ_TOOL`]: add it to the
/// host's `ToolSet` ([`EvictLayer::read_tool`](super::EvictLayer::read_tool)).
///
/// It answers with numbered lines (the preview's format, long lines clipped), says which lines
/// it shows and the offset of the next slice. It reads the value as a stream and stops once
/// the slice is complete, so the first page of a 50 MB result reads little more than that
/// page; the total number of lines is known (and said) once a slice reaches the end. A slice
/// also stops early, after at least one line, when it would pass the layer's token limit.
///
/// A path outside `/large_tool_results/`, a missing result, an offset past the end, bad
/// arguments or a backend failure are error results the model sees; nothing panics.
#[derive(Clone)]
pub struct ReadLargeResult {
    tool: FnTool<Reader, Reader>,
}

impl ReadLargeResult {
    pub(super) fn new(config: Arc<Config>) -> Self {
        let description = format!(
            "Read a slice of a large tool result that was saved to storage because it did not \
             fit in the context. `path` is the path its preview named (under {DIR}/); the \
             reply shows `limit` numbered lines (default {}) from line `offset` (1-based, \
             default 1) and the offset of the next slice. Long lines are clipped with a \
             marker naming the column to read on from: pass it as `column` with that line as \
             `offset`.",
            config.shape.read_lines
        );
        Self {
            tool: tool_fn(READ_TOOL, description, Reader { config }),
        }
    }
}

impl fmt::Debug for ReadLargeResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadLargeResult")
            .field("name", &READ_TOOL)
            .finish_non_exhaustive()
    }
}

impl Service<ToolRequest> for ReadLargeResult {
    type Response = ToolResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.tool.poll_ready(cx)
    }

    fn call(&mut self, req: ToolRequest) -> ResponseFuture {
        self.tool.call(req)
    }
}

impl Tool for ReadLargeResult {
    fn spec(&self) -> ToolSpec {
        self.tool.spec()
    }
}

/// The read tool's handler (and its marker for [`ToolHandler`]).
#[derive(Clone)]
struct Reader {
    config: Arc<Config>,
}

impl ToolHandler<Reader> for Reader {
    type Args = ReadArgs;
    type Output = String;
    type Error = String;
    type Future = BoxFuture<'static, Result<String, String>>;

    fn call(
        &self,
        args: ReadArgs,
        ctx: RunContext,
        _call: &ToolCall,
        _resume: Option<Value>,
    ) -> Self::Future {
        let config = Arc::clone(&self.config);
        let session = ctx.session_id().to_owned();
        Box::pin(async move { read(&config, args, &session).await })
    }
}

/// One slice of the result `args.path`, rendered.
async fn read(config: &Config, args: ReadArgs, session: &str) -> Result<String, String> {
    let Some(path) = parse_result_path(&args.path, session) else {
        let (shown, _) = clip_chars(&args.path, 200);
        return Err(format!(
            "`{shown}` is not the path of a stored result: use the path a preview named, \
             under {DIR}/."
        ));
    };
    let offset = args.offset.unwrap_or(1).max(1);
    let limit = args.limit.unwrap_or(config.shape.read_lines).max(1);
    let stream = config.storage.get_stream(&path).await.map_err(|error| {
        if error.is_not_found() {
            format!("no stored result at {path}: check the path the preview named.")
        } else {
            format!("the result at {path} could not be read: {error}")
        }
    })?;
    let column = args.column.unwrap_or(1).max(1);
    let slice = Slicer {
        column,
        offset,
        end: offset.saturating_add(limit),
        config,
        out: String::new(),
        shown: 0,
        tokens: 0,
    };
    slice.run(stream, &path, limit).await
}

/// Reads lines `offset..end` of a stream.
struct Slicer<'a> {
    offset: usize,
    column: usize,
    end: usize,
    config: &'a Config,
    out: String,
    shown: usize,
    tokens: usize,
}

/// How a slice ended.
enum End {
    /// At the end of the value, which has this many lines.
    Eof(usize),
    /// Before the end; the next slice starts at this line.
    More { next: usize, budget: bool },
}

impl Slicer<'_> {
    async fn run(
        mut self,
        mut stream: ByteStream,
        path: &StoragePath,
        limit: usize,
    ) -> Result<String, String> {
        let max_chars = self.config.shape.max_line_chars;
        // The number of the line the next byte belongs to.
        let mut line = 1_usize;
        let mut buf = LineBuf::new(max_chars);
        // The first line shown starts at `column`.
        buf.skip = self.column - 1;
        let mut partial = false;
        let end = 'read: {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk
                    .map_err(|error| format!("the result at {path} could not be read: {error}"))?;
                let mut rest: &[u8] = &chunk;
                while !rest.is_empty() {
                    if line >= self.end {
                        break 'read End::More {
                            next: line,
                            budget: false,
                        };
                    }
                    let wanted = line >= self.offset;
                    match rest.iter().position(|&b| b == b'\n') {
                        Some(i) => {
                            if wanted {
                                buf.push(&rest[..i]);
                                if !self.emit(line, &mut buf) {
                                    break 'read End::More {
                                        next: line,
                                        budget: true,
                                    };
                                }
                            }
                            line += 1;
                            partial = false;
                            rest = &rest[i + 1..];
                        }
                        None => {
                            if wanted {
                                buf.push(rest);
                            }
                            partial = true;
                            rest = &[];
                        }
                    }
                }
            }
            // The last line has no line break.
            if partial && line >= self.offset && line < self.end && !self.emit(line, &mut buf) {
                break 'read End::More {
                    next: line,
                    budget: true,
                };
            }
            End::Eof(if partial { line } else { line - 1 })
        };
        self.finish(end, path, limit)
    }

    /// Render the line in `buf` as line `number`; `false` (and nothing rendered) when it
    /// would pass the token limit after at least one line.
    fn emit(&mut self, number: usize, buf: &mut LineBuf) -> bool {
        let before = self.out.len();
        buf.render(&mut self.out, number);
        let tokens = self.config.counter.count_text(&self.out[before..]);
        if self.shown > 0 && self.tokens + tokens > self.config.limit {
            self.out.truncate(before);
            return false;
        }
        self.tokens += tokens;
        self.shown += 1;
        true
    }

    fn finish(mut self, end: End, path: &StoragePath, limit: usize) -> Result<String, String> {
        let first = self.offset;
        let last = first + self.shown.saturating_sub(1);
        match end {
            End::Eof(0) => Err(format!("the result at {path} is empty.")),
            End::Eof(total) if self.shown == 0 => Err(format!(
                "offset {first} is past the end of {path}: it has {total} lines. Use an offset \
                 from 1 to {total}."
            )),
            End::Eof(total) => {
                self.out.push_str(&format!(
                    "[Lines {first} to {last} of {total} shown: this is the end of the result.]"
                ));
                Ok(self.out)
            }
            End::More { next, budget } => {
                let why = if budget {
                    format!(
                        " (this slice stopped early at the size limit of {} tokens)",
                        self.config.limit
                    )
                } else {
                    String::new()
                };
                self.out.push_str(&format!(
                    "[Lines {first} to {last} shown{why}; the result goes on. Next slice: call \
                     `{READ_TOOL}` with {{\"path\": \"{path}\", \"offset\": {next}, \"limit\": \
                     {limit}}}.]"
                ));
                Ok(self.out)
            }
        }
    }
}

/// The start of one line, as its chunks arrive: its first `max` characters (never split) and
/// the number of characters after them.
struct LineBuf {
    kept: Vec<u8>,
    kept_chars: usize,
    more: usize,
    max: usize,
    full: bool,
    last: Option<u8>,
    /// Characters still to skip at the start of this line (a `column` past 1).
    skip: usize,
    /// Characters skipped at the start of this line.
    skipped: usize,
    /// The character being read was skipped.
    skipping: bool,
}

impl LineBuf {
    fn new(max: usize) -> Self {
        Self {
            kept: Vec::new(),
            kept_chars: 0,
            more: 0,
            max,
            full: false,
            last: None,
            skip: 0,
            skipped: 0,
            skipping: false,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let Some(&last) = bytes.last() else {
            return;
        };
        self.last = Some(last);
        if self.full {
            self.more += count_starts(bytes);
            return;
        }
        for (i, &b) in bytes.iter().enumerate() {
            if is_char_start(b) {
                if self.skip > 0 {
                    self.skip -= 1;
                    self.skipped += 1;
                    self.skipping = true;
                    continue;
                }
                self.skipping = false;
                if self.kept_chars == self.max {
                    self.full = true;
                    self.more += count_starts(&bytes[i..]);
                    return;
                }
                self.kept_chars += 1;
            } else if self.skipping {
                continue;
            }
            self.kept.push(b);
        }
    }

    /// Append the line as line `number` and empty the buffer for the next one.
    fn render(&mut self, out: &mut String, number: usize) {
        // A `\r` before the line break is not part of the line.
        if self.last == Some(b'\r') {
            if self.full {
                self.more -= 1;
            } else if !self.skipping {
                self.kept.pop();
            }
        }
        let kept = String::from_utf8_lossy(&self.kept);
        let next = self.skipped + self.kept_chars + 1;
        push_line(out, number, &kept, self.more, next);
        self.kept.clear();
        self.kept_chars = 0;
        self.more = 0;
        self.full = false;
        self.last = None;
        self.skip = 0;
        self.skipped = 0;
        self.skipping = false;
    }
}

fn is_char_start(byte: u8) -> bool {
    (byte as i8) >= -0x40
}

fn count_starts(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| is_char_start(b)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(chunks: &[&str], max: usize) -> String {
        let mut buf = LineBuf::new(max);
        for chunk in chunks {
            buf.push(chunk.as_bytes());
        }
        let mut out = String::new();
        buf.render(&mut out, 1);
        out
    }

    #[test]
    fn a_line_split_across_chunks_is_clipped_by_characters() {
        assert_eq!(line(&["ab", "c"], 5), "     1\tabc\n");
        assert_eq!(
            line(&["日本", "語日本語"], 2),
            "     1\t日本 [... line clipped: 4 more characters, from column 3]\n"
        );
        assert_eq!(line(&["abc\r"], 3), "     1\tabc\n");
        assert_eq!(
            line(&["ab", "c\r"], 2),
            "     1\tab [... line clipped: 1 more character, from column 3]\n"
        );
        assert_eq!(line(&["ab\r"], 5), "     1\tab\n");
        assert_eq!(line(&[], 5), "     1\t\n");
    }

    #[test]
    fn a_line_can_start_at_a_column() {
        let render = |chunks: &[&str], skip: usize, max: usize| {
            let mut buf = LineBuf::new(max);
            buf.skip = skip;
            for chunk in chunks {
                buf.push(chunk.as_bytes());
            }
            let mut out = String::new();
            buf.render(&mut out, 7);
            out
        };
        assert_eq!(
            render(&["日本", "語日本語"], 2, 2),
            "     7\t語日 [... line clipped: 2 more characters, from column 5]\n"
        );
        assert_eq!(render(&["abcdef\r"], 4, 10), "     7\tef\n");
        assert_eq!(render(&["ab\r"], 5, 10), "     7\t\n");
        // Only the first line of a slice starts late.
        let mut buf = LineBuf::new(10);
        buf.skip = 2;
        buf.push(b"abcd");
        let mut out = String::new();
        buf.render(&mut out, 1);
        buf.push(b"abcd");
        buf.render(&mut out, 2);
        assert_eq!(out, "     1\tcd\n     2\tabcd\n");
    }

    #[test]
    fn a_character_split_across_chunks_stays_whole() {
        let text = "é日🙂";
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            let mut buf = LineBuf::new(2);
            buf.push(&bytes[..cut]);
            buf.push(&bytes[cut..]);
            let mut out = String::new();
            buf.render(&mut out, 1);
            assert_eq!(
                out, "     1\té日 [... line clipped: 1 more character, from column 3]\n",
                "{cut}"
            );
        }
    }
}
