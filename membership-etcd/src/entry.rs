//! A member's entry in etcd: its key and its JSON value, and the checks an entry read back
//! must pass (any runtime can write to the prefix, so what is read is a claim).
use std::collections::BTreeMap;

use rdmalane::membership::{Member, MemberId};
use serde::{Deserialize, Serialize};

/// The largest entry read back; anything longer is not one of ours.
const MAX_ENTRY: usize = 64 * 1024;
/// The longest label, address or provider name.
const MAX_FIELD: usize = 256;

/// Fields it does not know are ignored, so a later version may add some and still be read by
/// this one during a rolling upgrade.
#[derive(Serialize, Deserialize)]
struct Entry {
    /// Hex, 16 digits: a u64 does not survive JSON readers that use doubles.
    id: String,
    label: String,
    addr: String,
    provider: String,
    rails: usize,
    #[serde(default)]
    meta: BTreeMap<String, String>,
    /// The create revision of the member's first publication, once it publishes again under a
    /// new lease (its key then gets a new create revision): the member is as old as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    since: Option<u64>,
}

/// The folder all members of the cluster under `prefix` live in (ends in `/`).
pub(crate) fn folder(prefix: &str) -> String {
    format!("{}/members/", prefix.trim_end_matches('/'))
}

/// A member's key.
pub(crate) fn key(prefix: &str, id: MemberId) -> String {
    format!("{}{id}", folder(prefix))
}

/// The member a key names, if it is one of ours.
pub(crate) fn id_of(prefix: &str, key: &[u8]) -> Option<MemberId> {
    let key = std::str::from_utf8(key).ok()?;
    let hex = key.strip_prefix(&folder(prefix))?;
    // Exactly as `key` writes it: another spelling of the same id (capitals, a sign) would be
    // a second key for one member, whose deletion would report the live one gone.
    let canonical = hex.len() == 16 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    canonical.then(|| u64::from_str_radix(hex, 16).ok()).flatten().map(MemberId)
}

/// The value published for `me` (whose id must be set), first published at revision `since`
/// where that is known.
pub(crate) fn encode(me: &Member, since: Option<u64>) -> Vec<u8> {
    let e = Entry {
        since,
        id: me.id.map(|i| i.to_string()).unwrap_or_default(),
        label: me.label.clone(),
        addr: me.addr.clone(),
        provider: me.provider.clone().unwrap_or_default(),
        rails: me.rails.unwrap_or(1),
        meta: me.meta.clone(),
    };
    serde_json::to_vec(&e).expect("an entry always serialises")
}

/// The member an entry read back describes, or why it is not to be trusted.
/// Would the others read `me`'s entry? `Err` says why not (what [`decode`] would refuse), so
/// that a member never publishes an entry every other member drops: it would be invisible.
pub(crate) fn check(prefix: &str, me: &Member) -> Result<(), String> {
    let id = me.id.ok_or("it has no runtime id")?;
    // The largest first revision it may carry later.
    decode(prefix, key(prefix, id).as_bytes(), &encode(me, Some(u64::MAX)), i64::MAX).map(|_| ())
}

pub(crate) fn decode(prefix: &str, key: &[u8], value: &[u8], revision: i64) -> Result<Member, String> {
    let Some(id) = id_of(prefix, key) else {
        return Err("its key does not name a member id".into());
    };
    if value.len() > MAX_ENTRY {
        return Err(format!("{} bytes (at most {MAX_ENTRY})", value.len()));
    }
    let e: Entry = serde_json::from_slice(value).map_err(|e| format!("not an entry: {e}"))?;
    if e.id != id.to_string() {
        return Err(format!("its value names id {:?}, its key {id}", e.id));
    }
    for (name, field) in [("label", &e.label), ("addr", &e.addr), ("provider", &e.provider)] {
        if field.is_empty() || field.len() > MAX_FIELD {
            return Err(format!("its {name} is {} bytes (1 to {MAX_FIELD})", field.len()));
        }
    }
    Ok(Member {
        id: Some(id),
        label: e.label,
        addr: e.addr,
        provider: Some(e.provider),
        rails: Some(e.rails),
        meta: e.meta,
        // An earlier first publication counts, never a later one: no entry can claim to be
        // newer than its key.
        revision: match e.since {
            Some(first) if first > 0 && first <= revision.max(0) as u64 => first,
            _ => revision.max(0) as u64,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Member {
        Member {
            id: Some(MemberId(0xab)),
            label: "prefill-3".into(),
            addr: "127.0.0.1:7000".into(),
            provider: Some("tcp;ofi_rxm".into()),
            rails: Some(2),
            meta: [("gpu".to_string(), "h200".to_string())].into(),
            revision: 0,
        }
    }

    #[test]
    fn round_trips() {
        let k = key("/rdmalane/prod/", MemberId(0xab));
        assert_eq!(k, "/rdmalane/prod/members/00000000000000ab");
        let back = decode("/rdmalane/prod", k.as_bytes(), &encode(&me(), None), 42).unwrap();
        assert_eq!(back, Member { revision: 42, ..me() });
    }

    #[test]
    fn refuses_what_does_not_add_up() {
        let k = key("/c", MemberId(0xab));
        let other = key("/c", MemberId(0xac));
        assert!(decode("/c", other.as_bytes(), &encode(&me(), None), 1).unwrap_err().contains("names id"));
        assert!(decode("/c", b"/c/members/xyz", &encode(&me(), None), 1).unwrap_err().contains("key"));
        assert!(decode("/c", k.as_bytes(), b"{not json", 1).unwrap_err().contains("not an entry"));
        let mut empty = me();
        empty.label.clear();
        assert!(decode("/c", k.as_bytes(), &encode(&empty, None), 1).unwrap_err().contains("label"));
        let big = vec![b' '; MAX_ENTRY + 1];
        assert!(decode("/c", k.as_bytes(), &big, 1).unwrap_err().contains("bytes"));
    }

    #[test]
    fn an_entry_the_others_would_refuse_is_caught_before_it_is_published() {
        assert_eq!(check("/c", &me()), Ok(()));
        let mut m = me();
        m.label.clear();
        assert!(check("/c", &m).unwrap_err().contains("label"));
        let mut m = me();
        m.addr = "x".repeat(MAX_FIELD + 1);
        assert!(check("/c", &m).unwrap_err().contains("addr"));
        let mut m = me();
        m.meta.insert("blob".into(), "y".repeat(MAX_ENTRY));
        assert!(check("/c", &m).unwrap_err().contains("bytes"));
        let mut m = me();
        m.id = None;
        assert!(check("/c", &m).unwrap_err().contains("id"));
    }

    #[test]
    fn a_member_published_again_keeps_its_first_revision_and_unknown_fields_are_read() {
        let k = key("/c", MemberId(0xab));
        let again = decode("/c", k.as_bytes(), &encode(&me(), Some(7)), 42).unwrap();
        assert_eq!(again.revision, 7, "as old as its first publication");
        let later = decode("/c", k.as_bytes(), &encode(&me(), Some(50)), 42).unwrap();
        assert_eq!(later.revision, 42, "no claim past its key's own revision");
        let mut v: serde_json::Value = serde_json::from_slice(&encode(&me(), None)).unwrap();
        v["zone"] = "eu-1".into();
        let newer = decode("/c", k.as_bytes(), &serde_json::to_vec(&v).unwrap(), 3).unwrap();
        assert_eq!(newer, Member { revision: 3, ..me() }, "a later version's field is ignored");
    }

    #[test]
    fn an_id_has_one_spelling() {
        assert_eq!(id_of("/c", b"/c/members/00000000000000ab"), Some(MemberId(0xab)));
        for other in ["00000000000000AB", "+0000000000000ab", "000000000000000ab", "0x000000000000ab"] {
            assert_eq!(id_of("/c", format!("/c/members/{other}").as_bytes()), None, "{other}");
        }
    }

    #[test]
    fn prefixes_do_not_overlap() {
        let k = key("/a", MemberId(1));
        assert_eq!(id_of("/a", k.as_bytes()), Some(MemberId(1)));
        assert_eq!(id_of("/ab", k.as_bytes()), None);
        assert_eq!(id_of("/a/b", k.as_bytes()), None);
    }
}
