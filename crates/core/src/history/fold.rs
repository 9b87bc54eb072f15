//! A value a layer keeps over a run's history, brought up to date with what each request
//! added.

use super::{History, HistoryMark};

/// A value a layer keeps over a run's history (a token count, the call ids it checked, how far
/// it redacted): each time, only the messages added since it last looked are folded in; when
/// the history no longer starts as it did (a summary, an edit), the value starts over from the
/// whole history. The one way the built-ins read a growing history without reading it whole
/// every round; it holds no message.
///
/// ```
/// use tower_agent_core::{History, Message};
/// use tower_agent_core::history::HistoryFold;
///
/// // The characters of a history's messages, read once each.
/// fn chars(fold: &mut HistoryFold<usize>, history: &History) -> usize {
///     fold.update(history, |n, from| {
///         *n += history[from..].iter().map(|m| m.text().len()).sum::<usize>();
///         *n
///     })
/// }
///
/// let mut fold = HistoryFold::default();
/// let mut history = History::from(vec![Message::user("abc")]);
/// assert_eq!(chars(&mut fold, &history), 3);
/// history.push(Message::assistant("de"));
/// assert_eq!(fold.unread(&history).0, 1, "the new message is the one unread");
/// assert_eq!(chars(&mut fold, &history), 5);
/// let rewritten = History::from(vec![Message::user("x")]);
/// assert_eq!(chars(&mut fold, &rewritten), 1, "a rewritten history is read whole");
/// ```
#[derive(Debug, Clone, Default)]
pub struct HistoryFold<T> {
    mark: Option<HistoryMark>,
    value: T,
}

impl<T: Default> HistoryFold<T> {
    /// Where the messages of `history` not folded in yet start, and the value so far: `0` and
    /// a fresh value when `history` does not start with what was folded.
    pub fn unread(&mut self, history: &History) -> (usize, &mut T) {
        let from = match self.mark {
            Some(mark) if history.since(&mark).is_some() => mark.len(),
            _ => {
                self.value = T::default();
                0
            }
        };
        (from, &mut self.value)
    }

    /// `history` is folded in, to its end.
    pub fn read(&mut self, history: &History) {
        self.mark = Some(history.mark());
    }

    /// Fold in what `history` added: `add` gets the value and where the messages not folded
    /// in yet start ([`HistoryFold::unread`]); then `history` counts as read.
    pub fn update<R>(&mut self, history: &History, add: impl FnOnce(&mut T, usize) -> R) -> R {
        let (from, value) = self.unread(history);
        let out = add(value, from);
        self.read(history);
        out
    }

    /// The value of the history `mark` marks, as a layer that made or checked it knows it.
    pub fn set(&mut self, mark: HistoryMark, value: T) {
        self.mark = Some(mark);
        self.value = value;
    }

    /// Start over: the next look reads the whole history.
    pub fn forget(&mut self) {
        self.mark = None;
        self.value = T::default();
    }
}
