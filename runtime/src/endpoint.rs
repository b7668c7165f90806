//! A connection to one peer and the operations on it.
use std::fmt;

use std::sync::{Arc, Weak};

use crate::base::batch::{Layout, Pieces};
use crate::base::error::{Error, OpKind};
use crate::base::remote::RemoteBuf;
use crate::base::transport::WrKind;
use crate::bootstrap::LossSwitch;
use crate::buf::{IoBuf, IoBufMut};
use crate::op::Op;
use crate::reactor::cmd::Draft;
use crate::runtime::{Runtime, Slots};

/// A peer this runtime can exchange data with. Every operation takes its buffer by value and
/// gives it back with the result: `let (res, buf) = ep.write_remote(buf, &remote).await;`.
/// Dropping the endpoint closes the control connection; the peer sees it as lost.
pub struct Endpoint {
    rt: Runtime,
    /// The peer's slot in each rail group's reactor.
    slots: Slots,
    /// The peer's rail count.
    peer_rails: usize,
    peer_id: u64,
    label: String,
    /// The control connection's task, and the switch by which the cluster's membership may
    /// declare the peer lost through it.
    watch: Option<(tokio::task::JoinHandle<()>, Arc<LossSwitch>)>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint").field("peer", &self.label).finish()
    }
}

impl Endpoint {
    pub(crate) fn new(
        rt: Runtime,
        slots: Slots,
        peer_rails: usize,
        peer_id: u64,
        label: String,
        watch: Option<(tokio::task::JoinHandle<()>, Arc<LossSwitch>)>,
    ) -> Endpoint {
        Endpoint { rt, slots, peer_rails, peer_id, label, watch }
    }

    /// The switch that declares this peer lost, held weakly: it does nothing once the endpoint
    /// is gone.
    pub(crate) fn loss_switch(&self) -> Option<Weak<LossSwitch>> {
        self.watch.as_ref().map(|(_, s)| Arc::downgrade(s))
    }

    /// The peer runtime's id (descriptors it exposes carry it).
    pub fn peer_id(&self) -> u64 {
        self.peer_id
    }

    /// The peer as `addr#id`, as errors name it.
    pub fn peer(&self) -> &str {
        &self.label
    }

    /// The runtime this endpoint belongs to.
    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// Write all of `buf` to the start of `remote` (one-sided). Completes when the bytes are at
    /// the target.
    pub fn write_remote<B: IoBuf>(&self, buf: B, remote: &RemoteBuf) -> Op<B> {
        self.one_sided(OpKind::Write, buf, remote, None)
    }

    /// Like [`write_remote`](Self::write_remote), and the peer gets `imm` as an event
    /// (`Runtime::next_imm`) once the bytes are there. Nothing orders it against other writes.
    pub fn write_with_imm<B: IoBuf>(&self, buf: B, remote: &RemoteBuf, imm: u64) -> Op<B> {
        self.one_sided(OpKind::WriteImm, buf, remote, Some(imm))
    }

    /// Read `buf.len()` bytes from the start of `remote` into `buf` (one-sided).
    pub fn read_remote<B: IoBufMut>(&self, buf: B, remote: &RemoteBuf) -> Op<B> {
        self.one_sided(OpKind::Read, buf, remote, None)
    }

    /// Write `pieces` of `buf` to `remote` (one-sided) as one op: pieces contiguous on the
    /// remote side share a work request, gathered from `buf`; the rest go as a work request
    /// each, through the fair-share scheduler like any transfer. Resolves to the bytes moved
    /// once every piece is at the target; a failure names the first piece that failed
    /// ([`Error::Batch`]). Pieces outside `buf` or `remote` are refused before anything is posted.
    pub fn write_batch<B: IoBuf>(&self, buf: B, remote: &RemoteBuf, pieces: &Pieces) -> Op<B> {
        self.batch(OpKind::Write, buf, remote, pieces, None)
    }

    /// Like [`write_batch`](Self::write_batch), and every piece raises `imm` at the peer when it
    /// lands: the peer awaits them with `Runtime::wait_imm(imm, pieces.len())`, whatever order
    /// they land in. Each piece is one work request here (never split or merged), so it must fit
    /// the provider's largest message.
    pub fn write_batch_with_imm<B: IoBuf>(
        &self,
        buf: B,
        remote: &RemoteBuf,
        pieces: &Pieces,
        imm: u64,
    ) -> Op<B> {
        self.batch(OpKind::WriteImm, buf, remote, pieces, Some(imm))
    }

    /// Read `pieces` of `remote` into `buf` (one-sided) as one op; as
    /// [`write_batch`](Self::write_batch) with the direction reversed.
    pub fn read_batch<B: IoBufMut>(&self, buf: B, remote: &RemoteBuf, pieces: &Pieces) -> Op<B> {
        self.batch(OpKind::Read, buf, remote, pieces, None)
    }

    fn batch<B: IoBuf>(
        &self,
        op: OpKind,
        buf: B,
        remote: &RemoteBuf,
        pieces: &Pieces,
        imm: Option<u64>,
    ) -> Op<B> {
        let caps = self.rt.caps();
        let owner = if buf.runtime_id() == self.rt.id() {
            Ok(())
        } else {
            Err(Error::invalid(op, "buffer is registered with another runtime"))
        };
        let layout = owner
            .and_then(|_| self.check_remote(op, remote))
            .and_then(|_| self.check_imm(op, imm))
            .and_then(|_| {
                let max = caps.max_msg_size;
                Layout::new(op, pieces, buf.bytes_len(), remote.len(), caps.iov_limit, max, imm.is_some())
            })
            .and_then(|l| match pieces.iter().position(|p| imm.is_some() && p.len > caps.max_msg_size) {
                Some(i) => Err(Error::invalid(
                    op,
                    format!(
                        "piece {i} carries an immediate value and exceeds the provider's largest message"
                    ),
                )),
                None => Ok(l),
            });
        let layout = match layout {
            Ok(l) => l,
            Err(e) => return Op::failed(e, buf),
        };
        let (remote_addr, key) = (remote.addr(), remote.key());
        let kind = match op {
            OpKind::Read => WrKind::Read { remote_addr, key },
            _ => WrKind::Write { remote_addr, key, imm },
        };
        let locals = buf.staging().map(|_| pieces.local_ranges());
        self.submit_with(op, buf, kind, Some(Arc::new(layout)), remote.rail_keys(), locals)
    }

    /// Send `buf` as one message; the peer's `recv` gets it. A message above the provider's
    /// largest (`Caps::max_msg_size`, or `Builder::max_message`) goes by rendezvous: the peer
    /// reads it from `buf`, which stays exposed read-only to that peer until it has, and the
    /// send completes then. A peer whose receive buffer is too small fails both sides'
    /// operations (`FailureClass::Truncated`).
    #[inline]
    pub fn send<B: IoBuf>(&self, buf: B) -> Op<B> {
        self.two_sided(OpKind::Send, buf, WrKind::Send { imm: None })
    }

    /// Receive one message from this peer into `buf`; resolves to its length. A message longer
    /// than `buf` fails the receive.
    #[inline]
    pub fn recv<B: IoBufMut>(&self, buf: B) -> Op<B> {
        self.two_sided(OpKind::Recv, buf, WrKind::Recv)
    }

    /// Send a descriptor (of memory this runtime exposed) to the peer, which takes it with
    /// [`recv_descriptor`](Self::recv_descriptor): the usual way to hand over access.
    pub async fn send_descriptor(&self, d: &RemoteBuf) -> Result<(), Error> {
        let bytes = d.to_bytes();
        let mut msg = self.rt.alloc(bytes.len())?;
        msg.copy_from_slice(&bytes);
        self.send(msg).await.0.map(|_| ())
    }

    /// Receive a descriptor the peer sent with [`send_descriptor`](Self::send_descriptor);
    /// refuses anything that is not a well-formed descriptor of that peer.
    pub async fn recv_descriptor(&self) -> Result<RemoteBuf, Error> {
        let (n, buf) = self.recv(self.rt.alloc(RemoteBuf::MAX_ENCODED_LEN)?).await;
        let d = RemoteBuf::from_bytes(&buf[..n?])?;
        if d.owner() != self.peer_id {
            return Err(Error::invalid(
                OpKind::Recv,
                format!("descriptor of runtime {:x}, not of the peer", d.owner()),
            ));
        }
        Ok(d)
    }

    /// May `buf` carry `op` here? The common case (this runtime's buffer, within the largest
    /// message, not empty where one-sided) is settled inline, on a small op's path; anything
    /// else is looked at in full by [`check_local_fully`](Self::check_local_fully).
    #[inline]
    fn check_local<B: IoBuf>(&self, op: OpKind, buf: &B) -> Result<(), Error> {
        let len = buf.bytes_len();
        let one_sided = matches!(op, OpKind::Write | OpKind::WriteImm | OpKind::Read);
        if buf.runtime_id() == self.rt.id() && len <= self.rt.caps().max_msg_size && (len > 0 || !one_sided) {
            return Ok(());
        }
        self.check_local_fully(op, buf)
    }

    /// [`check_local`](Self::check_local) past its common case: the error that names what is
    /// wrong, or `Ok` for an op that goes split or by rendezvous.
    #[cold]
    #[inline(never)]
    fn check_local_fully<B: IoBuf>(&self, op: OpKind, buf: &B) -> Result<(), Error> {
        if buf.runtime_id() != self.rt.id() {
            return Err(Error::invalid(op, "buffer is registered with another runtime"));
        }
        let len = buf.bytes_len();
        let max = self.rt.caps().max_msg_size;
        let one_sided = matches!(op, OpKind::Write | OpKind::WriteImm | OpKind::Read);
        if one_sided && len == 0 {
            return Err(Error::invalid(op, "a zero-length one-sided op moves nothing"));
        }
        // One-sided ops are split into chunks the provider takes (a write with an immediate
        // value too: its last piece carries the value). A larger message goes by rendezvous:
        // a marker message carrying immediate data, and the receiver reads the bytes.
        if op == OpKind::Send && len > max && buf.memory().is_device() && buf.staging().is_none() {
            return Err(Error::invalid(
                op,
                format!(
                    "{len} bytes of {} exceed the provider's largest message ({max} bytes); a \
                     rendezvous send reads host memory only: write it with write_remote",
                    buf.memory()
                ),
            ));
        }
        if op == OpKind::Send && len > max && self.rt.caps().cq_data_size == 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "{len} bytes exceed the provider's largest message ({max} bytes), and it \
                     carries no immediate data to send it by rendezvous"
                ),
            ));
        }
        Ok(())
    }

    fn one_sided<B: IoBuf>(&self, op: OpKind, buf: B, remote: &RemoteBuf, imm: Option<u64>) -> Op<B> {
        let len = buf.bytes_len() as u64;
        let check = self
            .check_local(op, &buf)
            .and_then(|_| remote.check(op, 0, len))
            .and_then(|_| self.check_remote(op, remote))
            .and_then(|_| self.check_imm(op, imm));
        if let Err(e) = check {
            return Op::failed(e, buf);
        }
        let (remote_addr, key) = (remote.addr(), remote.key());
        let kind = match op {
            OpKind::Read => WrKind::Read { remote_addr, key },
            _ => WrKind::Write { remote_addr, key, imm },
        };
        self.submit_with(op, buf, kind, None, remote.rail_keys(), None)
    }

    fn check_remote(&self, op: OpKind, remote: &RemoteBuf) -> Result<(), Error> {
        if remote.owner() != self.peer_id {
            return Err(Error::invalid(
                op,
                format!("descriptor belongs to runtime {:x}, not to peer {}", remote.owner(), self.label),
            ));
        }
        let allowed = match op {
            OpKind::Read => remote.access().remote_read,
            _ => remote.access().remote_write,
        };
        if !allowed {
            return Err(Error::invalid(op, format!("the peer did not expose this region for {op}")));
        }
        Ok(())
    }

    fn check_imm(&self, op: OpKind, imm: Option<u64>) -> Result<(), Error> {
        let Some(v) = imm else { return Ok(()) };
        let bytes = self.rt.caps().cq_data_size.min(8);
        if bytes == 0 || (bytes < 8 && v >> (8 * bytes) != 0) {
            return Err(Error::invalid(
                op,
                format!("immediate {v:#x} does not fit the provider's {bytes}-byte immediate data"),
            ));
        }
        Ok(())
    }

    #[inline]
    fn two_sided<B: IoBuf>(&self, op: OpKind, buf: B, kind: WrKind) -> Op<B> {
        if let Err(e) = self.check_local(op, &buf) {
            return Op::failed(e, buf);
        }
        self.submit(op, buf, kind)
    }

    #[inline]
    fn submit<B: IoBuf>(&self, op: OpKind, buf: B, kind: WrKind) -> Op<B> {
        self.submit_with(op, buf, kind, None, None, None)
    }

    #[inline]
    fn submit_with<B: IoBuf>(
        &self,
        op: OpKind,
        buf: B,
        kind: WrKind,
        batch: Option<Arc<Layout>>,
        rail_keys: Option<Arc<[u64]>>,
        locals: Option<Vec<std::ops::Range<usize>>>,
    ) -> Op<B> {
        // Split across rail groups only where every part can reach the peer's rails: a
        // one-sided op whose descriptor has a key for each of them.
        let one_sided = matches!(kind, WrKind::Write { .. } | WrKind::Read { .. });
        let keys = 1 + rail_keys.as_ref().map_or(0, |k| k.len());
        let fan = self.slots.by_group.len() > 1 && one_sided && keys >= self.peer_rails;
        let plain_imm = batch.is_none() && matches!(kind, WrKind::Write { imm: Some(_), .. });
        let draft = Draft {
            peer: self.slots.first,
            peer_id: self.peer_id,
            op,
            kind,
            tenant: 0,
            class: None,
            batch,
            rail_keys,
            // A plain write's immediate value is raised once, by the piece that ends it.
            slots: (fan && !plain_imm).then(|| self.slots.clone()),
            device: buf.memory().is_device() && buf.staging().is_none(),
        };
        // A device buffer on the staging path: its mirror moves, with copies around it.
        if let Some(view) = buf.staging() {
            return Op::staged(self.rt.clone(), draft, buf, view, locals);
        }
        Op::new(&self.rt, draft, buf)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some((w, _)) = self.watch.take() {
            w.abort();
        }
        self.rt.remove_peer(&self.slots);
    }
}
