//! A lane's two RC queue pairs: creation, the INIT → RTR → RTS walk, and the address a peer
//! needs to connect to them (exchanged by the rdmalane handshake).
use std::collections::VecDeque;

use rdma_sys::{
    ibv_access_flags as acc, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_qp_attr_mask as m, ibv_qp_state,
};

use crate::device::Device;

/// The two queue pairs of a lane, by index.
pub(crate) const DATA: usize = 0;
/// Writes with immediate data (and nothing else) go here; see the crate docs.
pub(crate) const NOTIFY: usize = 1;

/// Magic and version of a lane address.
const NAME_MAGIC: &[u8; 4] = b"RLV1";
/// Encoded length of a lane address.
pub(crate) const NAME_LEN: usize = 48;

/// What a peer needs to bring its queue pairs to RTR against ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaneName {
    pub(crate) lid: u16,
    pub(crate) roce: bool,
    pub(crate) mtu: u8,
    pub(crate) gid: [u8; 16],
    pub(crate) qpn: [u32; 2],
    pub(crate) psn: [u32; 2],
}

impl LaneName {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(NAME_LEN);
        b.extend_from_slice(NAME_MAGIC);
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.push(self.roce as u8);
        b.push(self.mtu);
        b.extend_from_slice(&self.gid);
        for q in [DATA, NOTIFY] {
            b.extend_from_slice(&self.qpn[q].to_le_bytes());
            b.extend_from_slice(&self.psn[q].to_le_bytes());
        }
        b.resize(NAME_LEN, 0);
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<LaneName, String> {
        if b.len() != NAME_LEN {
            return Err(format!(
                "peer lane address is {} bytes, a verbs lane address has {NAME_LEN}",
                b.len()
            ));
        }
        if &b[..4] != NAME_MAGIC {
            return Err(
                "peer lane address is not a verbs lane address (is the peer on another backend?)".into()
            );
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let n = LaneName {
            lid: u16::from_le_bytes([b[4], b[5]]),
            roce: b[6] != 0,
            mtu: b[7],
            gid: b[8..24].try_into().expect("16 bytes"),
            qpn: [u32_at(24), u32_at(32)],
            psn: [u32_at(28), u32_at(36)],
        };
        let reserved_clear = b[40..].iter().all(|&x| x == 0);
        if n.qpn.contains(&0)
            || !(1..=5).contains(&n.mtu)
            || n.psn.iter().any(|p| p >> 24 != 0)
            || b[6] > 1
            || !reserved_clear
        {
            return Err(format!("peer lane address is malformed: {n:?}"));
        }
        Ok(n)
    }
}

/// One lane: two RC queue pairs to one peer and the completion queue they share.
pub(crate) struct Lane {
    pub(crate) cq: *mut ibv_cq,
    pub(crate) qp: [*mut ibv_qp; 2],
    pub(crate) psn: [u32; 2],
    pub(crate) connected: bool,
    /// Set on the first error completion: the QP is in the error state for good; new work
    /// requests are refused with this text until the endpoint is established again.
    pub(crate) failed: Option<String>,
    /// Ids of send requests posted and not completed, per QP, in posting order: an RC send
    /// queue completes in order, so a completion completes the unsignalled requests before it
    /// too.
    pub(crate) posted: [VecDeque<u64>; 2],
    /// Posted send requests since the last signalled one, per QP.
    pub(crate) since_signal: [u32; 2],
}

/// Queue depths and inline size of the queue pairs we create.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpCaps {
    pub(crate) send_wr: u32,
    pub(crate) recv_wr: u32,
    pub(crate) sge: u32,
    pub(crate) inline: u32,
    /// Reads in flight per QP: as responder (max_qp_rd_atom) and as initiator
    /// (max_qp_init_rd_atom).
    pub(crate) rd_atom: (u8, u8),
}

/// Create an RC queue pair on `cq` and bring it to INIT; `caps.inline` is lowered to what
/// the device accepts.
pub(crate) fn create_qp(
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    dev: &Device,
    caps: &mut QpCaps,
) -> Result<*mut ibv_qp, String> {
    let mut last = String::new();
    // The device's inline limit is learnt by asking: create_qp refuses what it cannot do.
    let mut tries = vec![caps.inline];
    tries.extend([256, 128, 64, 0].into_iter().filter(|&v| v < caps.inline));
    for inline in tries {
        // SAFETY: a zeroed ibv_qp_init_attr is valid (null SRQ and context); we fill the rest.
        let mut attr: rdma_sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq;
        attr.recv_cq = cq;
        attr.qp_type = rdma_sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = caps.send_wr;
        attr.cap.max_recv_wr = caps.recv_wr;
        attr.cap.max_send_sge = caps.sge;
        attr.cap.max_recv_sge = caps.sge;
        attr.cap.max_inline_data = inline;
        // SAFETY: creating a QP on our PD and CQ from a filled attribute struct.
        let qp = unsafe { rdma_sys::ibv_create_qp(pd, &mut attr) };
        if qp.is_null() {
            last = format!("ibv_create_qp: {}", std::io::Error::last_os_error());
            continue;
        }
        caps.inline = inline;
        // SAFETY: a zeroed ibv_qp_attr is valid; only the masked fields are read.
        let mut a: rdma_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = dev.port;
        a.qp_access_flags =
            (acc::IBV_ACCESS_LOCAL_WRITE | acc::IBV_ACCESS_REMOTE_READ | acc::IBV_ACCESS_REMOTE_WRITE).0;
        let mask = m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS;
        // SAFETY: modifying the QP just created.
        let r = unsafe { rdma_sys::ibv_modify_qp(qp, &mut a, mask.0 as i32) };
        if r != 0 {
            // SAFETY: destroying the QP just created, once.
            unsafe { rdma_sys::ibv_destroy_qp(qp) };
            return Err(format!("ibv_modify_qp(INIT): {}", std::io::Error::from_raw_os_error(r)));
        }
        return Ok(qp);
    }
    Err(last)
}

/// Bring `qp` to RTR against the peer's queue pair `q` of `peer`, then to RTS.
pub(crate) fn connect_qp(
    qp: *mut ibv_qp,
    my_psn: u32,
    dev: &Device,
    peer: &LaneName,
    q: usize,
    rd_atom: (u8, u8),
) -> Result<(), String> {
    // SAFETY: a zeroed ibv_qp_attr is valid; only the masked fields are read.
    let mut a: rdma_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = ibv_qp_state::IBV_QPS_RTR;
    a.path_mtu = dev.active_mtu.min(peer.mtu as u32);
    a.dest_qp_num = peer.qpn[q];
    a.rq_psn = peer.psn[q];
    a.max_dest_rd_atomic = rd_atom.0;
    // 12: 0.64 ms before a receiver-not-ready retry.
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = dev.port;
    a.ah_attr.dlid = peer.lid;
    if dev.roce || peer.roce {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = ibv_gid { raw: peer.gid };
        a.ah_attr.grh.sgid_index = dev.gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    let mask = m::IBV_QP_STATE
        | m::IBV_QP_AV
        | m::IBV_QP_PATH_MTU
        | m::IBV_QP_DEST_QPN
        | m::IBV_QP_RQ_PSN
        | m::IBV_QP_MAX_DEST_RD_ATOMIC
        | m::IBV_QP_MIN_RNR_TIMER;
    // SAFETY: modifying our QP with a filled attribute struct.
    let r = unsafe { rdma_sys::ibv_modify_qp(qp, &mut a, mask.0 as i32) };
    if r != 0 {
        return Err(format!("ibv_modify_qp(RTR): {}", std::io::Error::from_raw_os_error(r)));
    }
    // SAFETY: as above.
    let mut a: rdma_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = ibv_qp_state::IBV_QPS_RTS;
    // 14: 67 ms ack timeout, 7 retries: a vanished peer fails posted work in about half a
    // second; the runtime's heartbeat decides about the peer itself.
    a.timeout = 14;
    a.retry_cnt = 7;
    // 7: retry forever while the peer has no receive posted (the runtime bounds the wait).
    a.rnr_retry = 7;
    a.sq_psn = my_psn;
    a.max_rd_atomic = rd_atom.1;
    let mask = m::IBV_QP_STATE
        | m::IBV_QP_TIMEOUT
        | m::IBV_QP_RETRY_CNT
        | m::IBV_QP_RNR_RETRY
        | m::IBV_QP_SQ_PSN
        | m::IBV_QP_MAX_QP_RD_ATOMIC;
    // SAFETY: as above.
    let r = unsafe { rdma_sys::ibv_modify_qp(qp, &mut a, mask.0 as i32) };
    if r != 0 {
        return Err(format!("ibv_modify_qp(RTS): {}", std::io::Error::from_raw_os_error(r)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_names_round_trip_and_bad_ones_are_refused() {
        let n = LaneName { lid: 7, roce: true, mtu: 3, gid: [9; 16], qpn: [17, 18], psn: [0x12345, 0xfff] };
        let b = n.encode();
        assert_eq!(b.len(), NAME_LEN);
        assert_eq!(LaneName::decode(&b), Ok(n));
        assert!(LaneName::decode(&b[..40]).unwrap_err().contains("48"));
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(LaneName::decode(&bad).unwrap_err().contains("not a verbs"));
        let mut bad = b.clone();
        bad[24..28].copy_from_slice(&0u32.to_le_bytes());
        assert!(LaneName::decode(&bad).unwrap_err().contains("malformed"));
        for _ in 0..1000 {
            let junk: Vec<u8> = (0..rand::random::<usize>() % 64).map(|_| rand::random()).collect();
            let _ = LaneName::decode(&junk);
        }
    }
}
