//! The cluster's view of its members, sans-IO: events in, the events worth reporting out, and
//! the rules for which entry a connect may use.
use std::collections::BTreeMap;

use super::{Member, MemberEvent, MemberId};
use crate::base::error::MembershipFailure;

/// An entry's key: its runtime id, or for a static entry (no id) its address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Id(MemberId),
    Addr(String),
}

fn key(m: &Member) -> Key {
    match m.id {
        Some(id) => Key::Id(id),
        None => Key::Addr(m.addr.clone()),
    }
}

/// The members but ourselves, by key.
#[derive(Debug)]
pub(crate) struct Table {
    me: MemberId,
    /// The address we publish: a static entry (no id) at it is us.
    my_addr: String,
    members: BTreeMap<Key, Member>,
}

impl Table {
    /// The table of runtime `me`, published at `my_addr`.
    pub(crate) fn new(me: MemberId, my_addr: String) -> Table {
        Table { me, my_addr, members: BTreeMap::new() }
    }

    /// Take in a directory event; returns it when it is news (a first join, a leave of a
    /// member we had), `None` for a repeat, an update of an entry we have, or our own entry.
    pub(crate) fn apply(&mut self, ev: MemberEvent) -> Option<MemberEvent> {
        // Our own entry: by id, or (a static list, the same on every member) by our address.
        let m = ev.member();
        if m.id == Some(self.me) || (m.id.is_none() && m.addr == self.my_addr) {
            return None;
        }
        match ev {
            MemberEvent::Joined(m) => match self.members.insert(key(&m), m.clone()) {
                None => Some(MemberEvent::Joined(m)),
                Some(_) => None,
            },
            MemberEvent::Left { member, reason } => {
                let had = self.members.remove(&key(&member))?;
                Some(MemberEvent::Left { member: had, reason })
            }
        }
    }

    /// Every member, oldest publication first.
    pub(crate) fn members(&self) -> Vec<Member> {
        let mut all: Vec<Member> = self.members.values().cloned().collect();
        all.sort_by_key(|m| m.revision);
        all
    }

    /// Whether the member is (still) in the directory.
    pub(crate) fn has(&self, id: MemberId) -> bool {
        self.members.contains_key(&Key::Id(id))
    }

    /// The entry a connect to `id` may use: there, and not superseded by a newer entry under
    /// its label.
    pub(crate) fn by_id(&self, id: MemberId) -> Result<&Member, (MembershipFailure, String)> {
        let Some(m) = self.members.get(&Key::Id(id)) else {
            return Err((MembershipFailure::UnknownMember, "not in the directory".into()));
        };
        match self.newest(&m.label) {
            Some(newer) if newer.id != m.id => Err((
                MembershipFailure::Superseded,
                format!("{} published the label {:?} after it", newer.name(), m.label),
            )),
            _ => Ok(m),
        }
    }

    /// The newest entry under `label`.
    pub(crate) fn newest(&self, label: &str) -> Option<&Member> {
        self.members.values().filter(|m| m.label == label).max_by_key(|m| m.revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, label: &str, revision: u64) -> Member {
        Member {
            id: Some(MemberId(id)),
            label: label.into(),
            addr: format!("127.0.0.1:{}", 1000 + id),
            provider: Some("tcp;ofi_rxm".into()),
            rails: Some(1),
            meta: Default::default(),
            revision,
        }
    }

    fn left(m: Member) -> MemberEvent {
        MemberEvent::Left { member: m, reason: "gone".into() }
    }

    #[test]
    fn joins_once_and_leaves_once() {
        let mut t = Table::new(MemberId(9), "127.0.0.1:9".into());
        let a = member(1, "a", 5);
        assert_eq!(t.apply(MemberEvent::Joined(a.clone())), Some(MemberEvent::Joined(a.clone())));
        assert_eq!(t.apply(MemberEvent::Joined(a.clone())), None, "a repeat is no news");
        let mut moved = a.clone();
        moved.meta.insert("k".into(), "v".into());
        assert_eq!(t.apply(MemberEvent::Joined(moved.clone())), None, "an update is no join");
        assert_eq!(t.members(), vec![moved.clone()]);
        assert_eq!(t.apply(left(a.clone())), Some(left(moved)), "the leave reports what we had");
        assert_eq!(t.apply(left(a)), None, "a second leave is no news");
        assert!(t.members().is_empty());
    }

    #[test]
    fn ignores_itself() {
        let mut t = Table::new(MemberId(9), "127.0.0.1:9".into());
        assert_eq!(t.apply(MemberEvent::Joined(member(9, "me", 1))), None);
        let listed =
            |addr: &str| Member { id: None, label: addr.into(), addr: addr.into(), ..member(0, "", 0) };
        assert_eq!(t.apply(MemberEvent::Joined(listed("127.0.0.1:9"))), None, "our address on a static list");
        assert!(t.members().is_empty());
        assert!(
            t.apply(MemberEvent::Joined(listed("127.0.0.1:10"))).is_some(),
            "another address is a member"
        );
    }

    #[test]
    fn a_restarted_label_supersedes_its_old_entry() {
        let mut t = Table::new(MemberId(9), "127.0.0.1:9".into());
        t.apply(MemberEvent::Joined(member(1, "db", 5)));
        t.apply(MemberEvent::Joined(member(2, "db", 8)));
        t.apply(MemberEvent::Joined(member(3, "web", 6)));
        assert_eq!(t.newest("db").and_then(|m| m.id), Some(MemberId(2)));
        assert_eq!(t.by_id(MemberId(1)).unwrap_err().0, MembershipFailure::Superseded);
        assert_eq!(t.by_id(MemberId(2)).unwrap().label, "db");
        assert_eq!(t.by_id(MemberId(4)).unwrap_err().0, MembershipFailure::UnknownMember);
        // Once the new one leaves, the old entry is the newest under its label again (a
        // connect to it is still checked against the runtime that answers).
        t.apply(left(member(2, "db", 8)));
        assert_eq!(t.newest("db").and_then(|m| m.id), Some(MemberId(1)));
        let order: Vec<u64> = t.members().iter().map(|m| m.revision).collect();
        assert_eq!(order, vec![5, 6]);
    }

    #[test]
    fn static_entries_are_keyed_by_address() {
        let mut t = Table::new(MemberId(9), "127.0.0.1:9".into());
        let mut s = member(0, "10.0.0.1:7000", 0);
        s.id = None;
        assert!(t.apply(MemberEvent::Joined(s.clone())).is_some());
        assert!(t.apply(MemberEvent::Joined(s.clone())).is_none());
        assert_eq!(t.newest("10.0.0.1:7000"), Some(&s));
    }
}
