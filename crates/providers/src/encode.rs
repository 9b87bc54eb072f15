//! Request bodies, with each message encoded once per run.
//!
//! A provider sends the whole history every round, so encoding it is the one cost that grows
//! with the session. The history only grows during a run: the encoded bytes of every message
//! are kept in the run's context with a [`HistoryMark`] of the history they came from, and a
//! later round reuses them for the messages its history still starts with
//! ([`History::kept`]), encoding only the rest. A history that changed (a layer rewrote it, a
//! summary replaced its start) is encoded again from the first message its edits may have
//! touched. A message's bytes depend on the message and the provider only, never on the model
//! or the options, which go in the frame around the messages.

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use tower_agent_core::{Error, ExtensionKey, History, HistoryMark, ModelRequest};

use crate::wire::{Endpoint, Format, Frame};

/// One message's encoded items.
#[derive(Debug)]
struct Entry {
    /// The turn the items belong to; `None`: they stand alone in the array.
    turn: Option<&'static str>,
    range: Range<usize>,
    /// Its last item can carry [`Frame::last_item`]'s fields.
    takes_fields: bool,
}

/// The encoded messages of a run, for one provider.
#[derive(Debug, Default)]
struct Encoded {
    /// The history the entries were encoded from, one entry per message.
    mark: Option<HistoryMark>,
    entries: Vec<Entry>,
    buffer: Vec<u8>,
    /// The entry the previous request's messages ended with, when the current ones hold them
    /// all and more.
    previous_end: Option<usize>,
}

impl Encoded {
    /// Keep the entries of the messages that did not change, encode the others.
    fn refresh<W: Format>(&mut self, messages: &History) -> Result<(), Error> {
        let same = self.mark.map_or(0, |mark| messages.kept(&mark));
        let before = self.entries.len();
        self.previous_end =
            (before > 0 && same == before && messages.len() > before).then(|| before - 1);
        if same < self.entries.len() {
            self.buffer.truncate(self.entries[same].range.start);
            self.entries.truncate(same);
        }
        // Until the encoding is done, the entries stand for no history.
        self.mark = None;
        for message in &messages[same..] {
            let start = self.buffer.len();
            let items = W::encode_message(message, &mut self.buffer)?;
            self.entries.push(Entry {
                turn: items.turn,
                range: start..self.buffer.len(),
                takes_fields: items.last_takes_fields,
            });
        }
        self.mark = Some(messages.mark());
        Ok(())
    }

    /// The body: the frame around the messages' items, merged into turns where the provider
    /// has them.
    fn assemble<W: Format>(&self, frame: &Frame) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            frame.head.len() + self.buffer.len() + frame.tail.len() + 32 * self.entries.len(),
        );
        out.extend_from_slice(&frame.head);
        let mut first = !frame.head_has_items;
        let mut open: Option<&'static str> = None;
        let mut first_in_turn = true;
        // The previous request's last entry, when it gets the fields too.
        let previous = match (&frame.last_item, frame.previous_item, self.previous_end) {
            (Some(fields), true, Some(at))
                if self.entries[at].takes_fields
                    && self.entries[at + 1..].iter().any(|e| !e.range.is_empty()) =>
            {
                Some((at, fields.as_slice()))
            }
            _ => None,
        };
        for (index, entry) in self.entries.iter().enumerate() {
            if entry.range.is_empty() {
                continue;
            }
            let whole = &self.buffer[entry.range.clone()];
            // The fields go before the closing `}` of the entry's last item.
            let (bytes, fields) = match previous {
                Some((at, fields)) if at == index && whole.last() == Some(&b'}') => {
                    (&whole[..whole.len() - 1], Some(fields))
                }
                _ => (whole, None),
            };
            match entry.turn {
                None => {
                    if !std::mem::take(&mut first) {
                        out.push(b',');
                    }
                    out.extend_from_slice(bytes);
                }
                Some(turn) if open == Some(turn) => {
                    if !std::mem::take(&mut first_in_turn) {
                        out.push(b',');
                    }
                    out.extend_from_slice(bytes);
                }
                Some(turn) => {
                    if open.is_some() {
                        out.extend_from_slice(b"]}");
                    }
                    if !std::mem::take(&mut first) {
                        out.push(b',');
                    }
                    out.extend_from_slice(b"{\"role\":\"");
                    out.extend_from_slice(turn.as_bytes());
                    out.extend_from_slice(b"\",\"");
                    out.extend_from_slice(W::SPEC.turn_items.as_bytes());
                    out.extend_from_slice(b"\":[");
                    out.extend_from_slice(bytes);
                    open = Some(turn);
                    first_in_turn = false;
                }
            }
            if let Some(fields) = fields {
                out.extend_from_slice(fields);
                out.push(b'}');
            }
        }
        // The last item ends with its object's `}`: the fields go before it.
        if let (Some(fields), Some(b'}')) = (&frame.last_item, out.last()) {
            if out.len() > frame.head.len() {
                out.pop();
                out.extend_from_slice(fields);
                out.push(b'}');
            }
        }
        if open.is_some() {
            out.extend_from_slice(b"]}");
        }
        out.extend_from_slice(&frame.tail);
        out
    }
}

/// The encoded messages a provider keeps in a run's context, under the provider's own key.
#[derive(Clone, Default)]
pub(crate) struct Kept(Arc<Mutex<Encoded>>);

/// Where one provider (and its clones) keeps its [`Kept`] messages in a run's context.
pub(crate) type KeptKey = ExtensionKey<Kept>;

/// The request body for `req`. With `across_rounds`, the key of what the provider keeps:
/// messages encoded for an earlier request of the same run are reused.
pub(crate) fn body<W: Format>(
    wire: &W,
    endpoint: &Endpoint,
    req: &ModelRequest,
    stream: bool,
    across_rounds: Option<&KeptKey>,
) -> Result<Vec<u8>, Error> {
    let frame = wire.frame(endpoint, req, stream)?;
    let Some(key) = across_rounds else {
        let mut encoded = Encoded::default();
        encoded.refresh::<W>(&req.messages)?;
        return Ok(encoded.assemble::<W>(&frame));
    };
    let kept = req.ctx.extension_at_or_insert_with(key, Kept::default);
    let mut encoded = kept.0.lock().unwrap_or_else(PoisonError::into_inner);
    encoded.refresh::<W>(&req.messages)?;
    Ok(encoded.assemble::<W>(&frame))
}

/// Overwrite `from` with `to` (as long) in the bytes a run keeps for `W`: a test sees whether
/// a later body reuses them (the overwrite shows) or encodes anew (it does not).
#[cfg(all(test, feature = "openai"))]
pub(crate) fn overwrite_kept(
    ctx: &tower_agent_core::RunContext,
    key: &KeptKey,
    from: &[u8],
    to: &[u8],
) -> bool {
    let kept = ctx.extension_at_or_insert_with(key, Kept::default);
    let mut encoded = kept.0.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(at) = encoded.buffer.windows(from.len()).position(|w| w == from) else {
        return false;
    };
    encoded.buffer[at..at + to.len()].copy_from_slice(to);
    true
}
