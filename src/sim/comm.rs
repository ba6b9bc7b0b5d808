//! The one communication layer of the simulated cluster: every message between devices
//! goes through `send` / `deliver` / `recv`, which count messages, elements, bytes and
//! rounds per device and per collective (exact counts, not estimates), and check that each
//! round's messages are received exactly once, so a collective that drops or duplicates a
//! message fails loudly. `Fault` injects such a bug for the tests. O(1) per message besides
//! moving its payload (no copy).

use crate::error::{Error, Result};
use crate::problem::Tensor;

/// A message: its payload is moved from sender to receiver.
#[derive(Debug)]
pub struct Message {
    pub src: usize,
    pub dst: usize,
    pub parts: Vec<Tensor>,
}

impl Message {
    pub fn elements(&self) -> u64 {
        self.parts.iter().map(|t| t.len() as u64).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.parts
            .iter()
            .map(|t| (t.len() * t.dtype().size_bytes()) as u64)
            .sum()
    }
}

/// A deliberate bug in the links, for tests: the `nth` message sent (counted from 0 over
/// the whole run) is lost, or arrives twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Drop { nth: u64 },
    Duplicate { nth: u64 },
}

/// What one device sent or received within one collective.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub messages: u64,
    pub elements: u64,
    pub bytes: u64,
    /// Rounds in which the device sent (or received) at least one message.
    pub rounds: u64,
}

/// The counters of one collective operation (a broadcast, an allreduce, a rotation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectiveStats {
    pub name: String,
    /// Synchronous rounds (communication steps) the collective took.
    pub steps: u64,
    pub sent: Vec<Traffic>,
    pub received: Vec<Traffic>,
}

impl CollectiveStats {
    pub fn elements(&self) -> u64 {
        self.sent.iter().map(|t| t.elements).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.sent.iter().map(|t| t.bytes).sum()
    }
}

pub struct Comm {
    p: usize,
    outbox: Vec<Message>,
    inbox: Vec<Vec<Message>>,
    log: Vec<CollectiveStats>,
    sent_this_round: Vec<bool>,
    received_this_round: Vec<bool>,
    messages_sent: u64,
    fault: Option<Fault>,
}

impl Comm {
    pub fn new(p: usize, fault: Option<Fault>) -> Comm {
        Comm {
            p,
            outbox: Vec::new(),
            inbox: (0..p).map(|_| Vec::new()).collect(),
            log: Vec::new(),
            sent_this_round: vec![false; p],
            received_this_round: vec![false; p],
            messages_sent: 0,
            fault,
        }
    }

    /// Starts a collective: the messages until the next `begin` are counted to it.
    pub fn begin(&mut self, name: &str) -> Result<()> {
        self.check_drained()?;
        self.log.push(CollectiveStats {
            name: name.to_string(),
            steps: 0,
            sent: vec![Traffic::default(); self.p],
            received: vec![Traffic::default(); self.p],
        });
        Ok(())
    }

    fn current(&mut self) -> Result<&mut CollectiveStats> {
        self.log
            .last_mut()
            .ok_or_else(|| bug("a message was sent outside any collective".into()))
    }

    /// Posts a message for the end of the round.
    pub fn send(&mut self, src: usize, dst: usize, parts: Vec<Tensor>) -> Result<()> {
        if src >= self.p || dst >= self.p || src == dst {
            return Err(bug(format!(
                "message from device {src} to device {dst} on {} devices",
                self.p
            )));
        }
        let msg = Message { src, dst, parts };
        let (elements, bytes) = (msg.elements(), msg.bytes());
        let t = &mut self.current()?.sent[src];
        t.messages += 1;
        t.elements += elements;
        t.bytes += bytes;
        self.sent_this_round[src] = true;
        let nth = self.messages_sent;
        self.messages_sent += 1;
        match self.fault {
            Some(Fault::Drop { nth: n }) if n == nth => {}
            Some(Fault::Duplicate { nth: n }) if n == nth => {
                let copy = Message {
                    src,
                    dst,
                    parts: msg.parts.clone(),
                };
                self.outbox.push(msg);
                self.outbox.push(copy);
            }
            _ => self.outbox.push(msg),
        }
        Ok(())
    }

    /// Ends a round: every posted message arrives. Fails if a message of the previous round
    /// was never received (a stray or duplicated message).
    pub fn deliver(&mut self) -> Result<()> {
        self.check_received()?;
        let stats = self
            .log
            .last_mut()
            .ok_or_else(|| bug("a round ended outside any collective".into()))?;
        stats.steps += 1;
        for (dev, sent) in self.sent_this_round.iter_mut().enumerate() {
            if std::mem::take(sent) {
                stats.sent[dev].rounds += 1;
            }
        }
        self.received_this_round.fill(false);
        for msg in self.outbox.drain(..) {
            self.inbox[msg.dst].push(msg);
        }
        Ok(())
    }

    /// The one message of this round from `src` to `dst`. Fails if none arrived (dropped) or
    /// more than one did (duplicated).
    pub fn recv(&mut self, dst: usize, src: usize) -> Result<Message> {
        let name = self.log.last().map_or("?", |s| s.name.as_str()).to_string();
        let round = self.log.last().map_or(0, |s| s.steps);
        let inbox = &mut self.inbox[dst];
        let hits = inbox.iter().filter(|m| m.src == src).count();
        if hits != 1 {
            return Err(bug(format!(
                "{name}, round {round}: device {dst} expected one message from device {src}, {hits} arrived ({})",
                if hits == 0 { "dropped" } else { "duplicated" }
            )));
        }
        let at = inbox.iter().position(|m| m.src == src).unwrap_or(0);
        let msg = inbox.swap_remove(at);
        let (elements, bytes) = (msg.elements(), msg.bytes());
        let first = !self.received_this_round[dst];
        self.received_this_round[dst] = true;
        let t = &mut self.current()?.received[dst];
        t.messages += 1;
        t.elements += elements;
        t.bytes += bytes;
        if first {
            t.rounds += 1;
        }
        Ok(msg)
    }

    /// Fails if any message is still posted (never delivered) or waiting (never received).
    pub fn check_drained(&self) -> Result<()> {
        if !self.outbox.is_empty() {
            return Err(bug(format!(
                "{} message(s) were posted but never delivered",
                self.outbox.len()
            )));
        }
        self.check_received()
    }

    /// Fails if any delivered message is still waiting (nobody received it).
    fn check_received(&self) -> Result<()> {
        for (dst, inbox) in self.inbox.iter().enumerate() {
            if let Some(m) = inbox.first() {
                let name = self.log.last().map_or("?", |s| s.name.as_str());
                return Err(bug(format!(
                    "{name}: {} message(s) to device {dst} (first from device {}) were never received (duplicated or stray)",
                    inbox.len(),
                    m.src
                )));
            }
        }
        Ok(())
    }

    /// The counters of every collective so far, after checking nothing is left in flight.
    pub fn finish(self) -> Result<Vec<CollectiveStats>> {
        self.check_drained()?;
        Ok(self.log)
    }
}

/// A failure of the simulated collectives themselves (a harness bug, or an injected fault).
fn bug(msg: String) -> Error {
    Error::Runtime(format!("simulated communication: {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(n: usize) -> Vec<Tensor> {
        vec![Tensor::F32(vec![1.0; n])]
    }

    #[test]
    fn counts_per_device_and_collective() {
        let mut c = Comm::new(3, None);
        c.begin("a").unwrap();
        c.send(0, 1, payload(4)).unwrap();
        c.send(
            1,
            2,
            vec![Tensor::from_f32(vec![0.0; 6], crate::problem::DType::Bf16)],
        )
        .unwrap();
        c.deliver().unwrap();
        assert_eq!(c.recv(1, 0).unwrap().elements(), 4);
        assert_eq!(c.recv(2, 1).unwrap().bytes(), 12);
        c.begin("b").unwrap();
        c.send(2, 0, payload(1)).unwrap();
        c.deliver().unwrap();
        c.recv(0, 2).unwrap();
        let log = c.finish().unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(
            (log[0].elements(), log[0].bytes(), log[0].steps),
            (10, 28, 1)
        );
        assert_eq!(log[0].sent[0].rounds, 1);
        assert_eq!(log[0].received[2].elements, 6);
        assert_eq!(log[1].sent[2].messages, 1);
    }

    #[test]
    fn a_dropped_message_fails_the_receive() {
        let mut c = Comm::new(2, Some(Fault::Drop { nth: 1 }));
        c.begin("x").unwrap();
        c.send(0, 1, payload(1)).unwrap();
        c.send(1, 0, payload(1)).unwrap();
        c.deliver().unwrap();
        c.recv(1, 0).unwrap();
        let e = c.recv(0, 1).unwrap_err().to_string();
        assert!(e.contains("dropped") && e.contains("device 0"), "{e}");
    }

    #[test]
    fn a_duplicated_message_fails_the_receive() {
        let mut c = Comm::new(2, Some(Fault::Duplicate { nth: 0 }));
        c.begin("x").unwrap();
        c.send(0, 1, payload(1)).unwrap();
        c.deliver().unwrap();
        let e = c.recv(1, 0).unwrap_err().to_string();
        assert!(e.contains("duplicated"), "{e}");
    }

    #[test]
    fn an_unreceived_message_fails_the_next_round() {
        let mut c = Comm::new(2, None);
        c.begin("x").unwrap();
        c.send(0, 1, payload(1)).unwrap();
        c.deliver().unwrap();
        assert!(c
            .deliver()
            .unwrap_err()
            .to_string()
            .contains("never received"));
    }
}
