//! Where a history stood: its lineage, and the marks that tell later how much of it another
//! history still starts with.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::message::Message;

use super::History;

/// Which histories share a start: every `History` with the same `id` holds the very same
/// messages (one `Arc`, or a copy made when another clone was alive, which gets a new `id`);
/// `parent` says which history this one was copied or edited from, and how many of its first
/// messages were kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Lineage {
    pub(super) id: u64,
    pub(super) parent: Option<(u64, usize)>,
}

impl Lineage {
    pub(super) fn new(parent: Option<(u64, usize)>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Lineage {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            parent,
        }
    }
}

/// Where a history stood when [`History::mark`] was called: enough to tell later how much of
/// it another history still starts with. Small and `Copy`; it holds no message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryMark {
    lineage: Lineage,
    len: usize,
}

impl HistoryMark {
    /// How many messages the marked history held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the marked history was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mark of the marked history's first `len` messages (all of them when it held
    /// fewer): for work done on a part of a history.
    pub fn up_to(self, len: usize) -> HistoryMark {
        HistoryMark {
            len: len.min(self.len),
            ..self
        }
    }
}

impl History {
    /// Where this history stands now; see [what changed since a mark](History#what-changed-since-a-mark).
    pub fn mark(&self) -> HistoryMark {
        HistoryMark {
            lineage: self.0.lineage,
            len: self.len(),
        }
    }

    /// How many of the marked history's first messages this history starts with, as far as
    /// its edits tell (never more than either holds; 0 when they share nothing known).
    pub fn kept(&self, mark: &HistoryMark) -> usize {
        let (this, that) = (self.0.lineage, mark.lineage);
        let shared = if this.id == that.id {
            usize::MAX
        } else {
            match (this.parent, that.parent) {
                (Some((parent, kept)), _) if parent == that.id => kept,
                (_, Some((parent, kept))) if parent == this.id => kept,
                (Some((a, kept_a)), Some((b, kept_b))) if a == b => kept_a.min(kept_b),
                _ => 0,
            }
        };
        shared.min(mark.len).min(self.len())
    }

    /// The messages added since `mark`, when this history still starts with all of the
    /// marked one; `None` when it was edited before the mark's end (or shares nothing known).
    pub fn since(&self, mark: &HistoryMark) -> Option<&[Message]> {
        (self.kept(mark) == mark.len).then(|| &self[mark.len..])
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::history) fn texts(n: usize) -> History {
        (0..n).map(|i| Message::user(i.to_string())).collect()
    }

    #[test]
    fn appending_keeps_a_mark_in_place_or_through_a_copy() {
        let mut h = texts(3);
        let mark = h.mark();
        h.push(Message::user("in place"));
        assert!(h.ptr_eq(&h.clone()));
        assert_eq!(h.since(&mark).map(<[Message]>::len), Some(1));
        let request = h.clone();
        let mark = h.mark();
        h.extend([Message::user("a"), Message::user("b")]); // copies: `request` is alive
        assert!(!h.ptr_eq(&request));
        assert_eq!(h.since(&mark).map(<[Message]>::len), Some(2));
        assert_eq!(request.kept(&h.mark()), 4, "the older one is a prefix");
        assert_eq!(request.since(&mark).map(<[Message]>::len), Some(0));
    }

    #[test]
    fn diverging_clones_keep_only_what_they_share() {
        let mut a = texts(2);
        let mut b = a.clone();
        a.push(Message::user("a")); // copies: `b` is alive
        b.push(Message::user("b")); // in place: `b` is alone now
        assert_eq!(a.kept(&b.mark()), 2);
        assert_eq!(b.kept(&a.mark()), 2);
        assert!(a.since(&b.mark()).is_none());
        let mut c = b.clone();
        let mut d = b.clone();
        c.push(Message::user("c"));
        d.push(Message::user("d"));
        assert_eq!(
            c.kept(&d.mark()),
            3,
            "siblings share their parent's messages"
        );
    }

    #[test]
    fn edits_keep_what_stands_before_them() {
        let mut h = texts(5);
        let mark = h.mark();
        h.tail_mut(3)[0] = Message::user("edited");
        assert_eq!(h.kept(&mark), 3);
        assert!(h.since(&mark).is_none());
        let mark = h.mark();
        h.make_mut().push(Message::user("any edit"));
        assert_eq!(h.kept(&mark), 0, "make_mut may have changed anything");
        let fresh = History::from(h.to_vec());
        assert_eq!(fresh.kept(&h.mark()), 0, "built anew: nothing known");
        let back: History = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!((back == h, back.kept(&h.mark())), (true, 0));
        let (mut x, mut y) = (History::new(), History::new());
        x.push(Message::user("x"));
        let mark = x.mark();
        y.push(Message::user("y"));
        assert_eq!(y.kept(&mark), 0, "two new histories share nothing");
    }
}
