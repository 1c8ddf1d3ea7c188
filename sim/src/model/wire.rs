//! The wire (as rxe's `rxe_net.c`): packets between QPs, with random and forced loss, random delay, and
//! in-order delivery between two QPs.

use super::Model;
use super::qp::QpModel;

pub(super) enum Response {
    Ack,
    ReadData(Vec<u8>),
    AtomicData(u64),
    RnrNak,
    /// Sequence error: `psn` is the responder's expected PSN.
    SeqNak,
    /// A fatal NAK; the requester's WQE completes with this status.
    Nak(u32),
}

pub(super) struct Request {
    pub(super) opcode: u32,
    pub(super) data: Vec<u8>,
    pub(super) len: u64,
    pub(super) remote_addr: u64,
    pub(super) rkey: u32,
    pub(super) imm: u32,
    pub(super) compare_add: u64,
    pub(super) swap: u64,
    pub(super) solicited: bool,
    pub(super) force_access_err: bool,
}

pub(super) enum Body {
    Req(Request),
    Resp(Response),
}

pub(super) struct Packet {
    pub(super) src: u32,
    pub(super) dst: u32,
    pub(super) psn: u64,
    pub(super) body: Body,
}

impl Model {
    pub(super) fn send_packet(&mut self, p: Packet, forced_loss: bool) {
        let is_req = matches!(p.body, Body::Req(_));
        let ppm = if is_req { self.cfg.loss_ppm } else { self.cfg.ack_loss_ppm };
        let lost = self.rng.chance_ppm(ppm) || forced_loss;
        if lost {
            if is_req {
                self.stats.packets_lost += 1;
            } else {
                self.stats.acks_lost += 1;
            }
            return;
        }
        let delay = self.rng.range(u64::from(self.cfg.wire_delay_min.max(1)), u64::from(self.cfg.wire_delay_max.max(1)));
        // Packets between two QPs arrive in the order they were sent (one path, IBA RC in-order delivery).
        let last = self.last_arrival.entry((p.src, p.dst)).or_insert(0);
        let at = (self.now + delay).max(*last);
        *last = at;
        self.wire_seq += 1;
        self.wire.insert((at, self.wire_seq), p);
    }

    pub(super) fn deliver(&mut self, p: Packet) {
        let Some(&slot) = self.qp_by_num.get(&p.dst) else { return };
        self.with_slot(slot, |m, q| match p.body {
            Body::Req(r) => m.responder_rx(q, p.src, p.psn, r),
            Body::Resp(r) => m.requester_rx(q, p.psn, r),
        });
    }

    /// Sends a response from responder `q` to requester `dst` (`dst` may be `q` itself for a scripted sink).
    pub(super) fn respond(&mut self, q: &mut QpModel, dst: u32, psn: u64, r: Response) {
        let lose = if dst == q.qpn {
            take_one(&mut q.lose_acks)
        } else {
            self.qp_by_num.get(&dst).and_then(|&s| self.qps[s].as_mut()).is_some_and(|d| take_one(&mut d.lose_acks))
        };
        self.send_packet(Packet { src: q.qpn, dst, psn, body: Body::Resp(r) }, lose);
    }
}

pub(super) fn take_one(counter: &mut u32) -> bool {
    if *counter > 0 {
        *counter -= 1;
        true
    } else {
        false
    }
}
