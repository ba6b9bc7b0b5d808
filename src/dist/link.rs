//! The MPI layer of the real-device variants: point-to-point exchanges, the simulation's
//! collective schedules (`sim::plan`) executed over MPI, and the library's own collectives
//! (MPI_Iallreduce, MPI_Ibcast). Every operation is nonblocking and polled against a
//! deadline (`dist::timeout_s`): one that does not complete in time means a rank died, hung
//! or diverged, and the run ends with MPI_Abort and a message naming the operation. The
//! counters are the simulated comm layer's (`sim::comm::Traffic` per collective, filled for
//! this rank and gathered at the end), counting logical transfers as the simulation does.
//! Cost: the transfers themselves; messages over `MAX_PIECE` bytes go in pieces (MPI counts
//! are 32-bit).

use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::request::{LocalScope, Request};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::error::{Error, Result};
use crate::problem::Tensor;
use crate::sim::comm::{CollectiveStats, Traffic};
use crate::sim::device::DeviceMemory;
use crate::sim::exec::Reduce;
use crate::sim::plan::Plan;
use crate::sim::stats::SimStats;

/// Largest piece one MPI call moves (well under the 2^31 - 1 count limit).
const MAX_PIECE: usize = 1 << 30;
/// Exit code of a run aborted by a timed-out operation.
const ABORT_CODE: i32 = 1;

/// The bytes of a slice of plain numbers (f32, bf16, f16, u64: no padding, any bit pattern
/// valid), for sending them as MPI_BYTE.
fn bytes_of<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: T is a plain number type (see above); the slice covers exactly v's memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn bytes_of_mut<T: Copy>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as `bytes_of`; every byte pattern is a valid value of T.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

pub fn f32_bytes(v: &[f32]) -> &[u8] {
    bytes_of(v)
}

pub fn f32_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    bytes_of_mut(v)
}

/// The bytes of elements `range` of a tensor.
pub fn tensor_bytes(t: &Tensor, range: std::ops::Range<usize>) -> &[u8] {
    match t {
        Tensor::F32(v) => bytes_of(&v[range]),
        Tensor::Bf16(v) => bytes_of(&v[range]),
        Tensor::F16(v) => bytes_of(&v[range]),
    }
}

pub fn tensor_bytes_mut(t: &mut Tensor, range: std::ops::Range<usize>) -> &mut [u8] {
    match t {
        Tensor::F32(v) => bytes_of_mut(&mut v[range]),
        Tensor::Bf16(v) => bytes_of_mut(&mut v[range]),
        Tensor::F16(v) => bytes_of_mut(&mut v[range]),
    }
}

/// Polls `reqs` until all complete; past the deadline, aborts every rank with a message.
fn wait_all<'a, D: ?Sized>(
    world: &SimpleCommunicator,
    mut reqs: Vec<Request<'a, D, &LocalScope<'a>>>,
    what: &str,
) {
    let start = Instant::now();
    let limit = super::timeout_s();
    while !reqs.is_empty() {
        reqs = reqs.into_iter().filter_map(|r| r.test().err()).collect();
        if reqs.is_empty() {
            break;
        }
        let waited = start.elapsed();
        if waited.as_secs_f64() > limit {
            abort(world, what, limit);
        }
        // Spin briefly (latency), then sleep a little: ranks may share cores
        // (`mpirun --oversubscribe`), and a busy poll would steal them from the compute.
        if waited < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn abort(world: &SimpleCommunicator, what: &str, limit: f64) -> ! {
    eprintln!(
        "error: rank {} of {}: {what} did not complete within {limit} s: another rank died, hung or diverged; aborting all ranks (raise the limit with `sweep --mpi-timeout SECONDS`)",
        world.rank(),
        world.size()
    );
    world.abort(ABORT_CODE)
}

/// The test hook: the chosen rank hangs or dies here.
fn maybe_stall(rank: usize) {
    match super::fault() {
        Some(super::Fault::Stall(r)) if r == rank => {
            eprintln!("rank {rank}: stalling on purpose (--mpi-test-fault)");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Some(super::Fault::Die(r)) if r == rank => {
            eprintln!("rank {rank}: dying on purpose (--mpi-test-fault)");
            std::process::exit(9);
        }
        _ => {}
    }
}

/// Whether every rank says `ok`.
pub fn all_ok(ok: bool) -> Result<bool> {
    let world = SimpleCommunicator::world();
    let send = [u8::from(ok)];
    let mut all = [0u8];
    mpi::request::scope(|sc| {
        let r =
            world.immediate_all_reduce_into(sc, &send[..], &mut all[..], SystemOperation::min());
        wait_all(&world, vec![r], "agreeing that every rank is ready");
    });
    Ok(all[0] == 1)
}

/// `buf` on every rank as `root` holds it.
pub fn broadcast_f32(root: usize, buf: &mut [f32], what: &str) -> Result<()> {
    let world = SimpleCommunicator::world();
    mpi::request::scope(|sc| {
        let r = world
            .process_at_rank(root as i32)
            .immediate_broadcast_into(sc, buf);
        wait_all(&world, vec![r], what);
    });
    Ok(())
}

/// One rank's end of the communication of one call: counters per collective, time spent.
pub struct Link {
    world: SimpleCommunicator,
    pub rank: usize,
    pub p: usize,
    log: Vec<CollectiveStats>,
    sent_this_round: bool,
    received_this_round: bool,
    comm: Duration,
}

impl Link {
    pub fn new() -> Link {
        let world = SimpleCommunicator::world();
        let (rank, p) = (world.rank() as usize, world.size() as usize);
        Link {
            world,
            rank,
            p,
            log: Vec::new(),
            sent_this_round: false,
            received_this_round: false,
            comm: Duration::ZERO,
        }
    }

    /// Starts a collective named as in the simulation (`sim::ring::ROTATION`, ...).
    pub fn begin(&mut self, name: &str) {
        self.log.push(CollectiveStats {
            name: name.to_string(),
            steps: 0,
            sent: vec![Traffic::default(); self.p],
            received: vec![Traffic::default(); self.p],
        });
    }

    fn count(&mut self, sent: bool, elements: u64, bytes: u64) {
        let rank = self.rank;
        let Some(c) = self.log.last_mut() else {
            return;
        };
        let (t, first) = if sent {
            (
                &mut c.sent[rank],
                !std::mem::replace(&mut self.sent_this_round, true),
            )
        } else {
            (
                &mut c.received[rank],
                !std::mem::replace(&mut self.received_this_round, true),
            )
        };
        t.messages += 1;
        t.elements += elements;
        t.bytes += bytes;
        if first {
            t.rounds += 1;
        }
    }

    /// Counts one logical transfer (which may be several MPI messages, e.g. K and V).
    pub fn count_send(&mut self, elements: usize, bytes: usize) {
        self.count(true, elements as u64, bytes as u64);
    }

    pub fn count_recv(&mut self, elements: usize, bytes: usize) {
        self.count(false, elements as u64, bytes as u64);
    }

    /// Ends a synchronous round of the current collective.
    pub fn end_round(&mut self) {
        if let Some(c) = self.log.last_mut() {
            c.steps += 1;
        }
        self.sent_this_round = false;
        self.received_this_round = false;
    }

    /// Posts every send and receive (in pieces of at most `MAX_PIECE` bytes, in order), runs
    /// `overlap` meanwhile, then waits for all of them against the deadline. Not counted
    /// here: callers count logical transfers.
    pub fn exchange<R>(
        &mut self,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
        what: &str,
        overlap: impl FnOnce() -> R,
    ) -> R {
        maybe_stall(self.rank);
        let world = &self.world;
        let mut waited = Duration::ZERO;
        let out = mpi::request::scope(|sc| {
            let t0 = Instant::now();
            let mut reqs = Vec::new();
            for (src, buf) in recvs.iter_mut() {
                let proc = world.process_at_rank(*src as i32);
                for piece in buf.chunks_mut(MAX_PIECE) {
                    reqs.push(proc.immediate_receive_into(sc, piece));
                }
            }
            for (dst, buf) in sends {
                let proc = world.process_at_rank(*dst as i32);
                for piece in buf.chunks(MAX_PIECE) {
                    reqs.push(proc.immediate_send(sc, piece));
                }
            }
            let posted = t0.elapsed();
            let out = overlap();
            let t1 = Instant::now();
            wait_all(world, reqs, what);
            waited = posted + t1.elapsed();
            out
        });
        self.comm += waited;
        out
    }

    /// This rank's part of an allreduce schedule over `buf`, as collective `name`: each
    /// round, its sends go from `buf` and its receives into scratch, then are added (or
    /// stored) once the round completes.
    pub fn allreduce_plan(
        &mut self,
        name: &str,
        plan: &Plan,
        buf: &mut [f32],
        op: Reduce,
    ) -> Result<()> {
        self.begin(name);
        let me = self.rank;
        for (k, round) in plan.rounds.iter().enumerate() {
            let mine_in: Vec<_> = round.iter().filter(|t| t.dst == me).collect();
            let mut scratch: Vec<Vec<f32>> =
                mine_in.iter().map(|t| vec![0.0; t.range.len()]).collect();
            {
                let sends: Vec<(usize, &[u8])> = round
                    .iter()
                    .filter(|t| t.src == me)
                    .map(|t| (t.dst, bytes_of(&buf[t.range.clone()])))
                    .collect();
                let mut recvs: Vec<(usize, &mut [u8])> = mine_in
                    .iter()
                    .zip(scratch.iter_mut())
                    .map(|(t, s)| (t.src, bytes_of_mut(s)))
                    .collect();
                let what = format!("{name}, round {k}");
                self.exchange(&sends, &mut recvs, &what, || ());
            }
            for t in round.iter().filter(|t| t.src == me) {
                self.count_send(t.range.len(), 4 * t.range.len());
            }
            for (t, got) in mine_in.iter().zip(&scratch) {
                self.count_recv(got.len(), 4 * got.len());
                let dst = &mut buf[t.range.clone()];
                match (t.reduce, op) {
                    (false, _) => dst.copy_from_slice(got),
                    (true, Reduce::Sum) => dst.iter_mut().zip(got).for_each(|(a, b)| *a += b),
                    (true, Reduce::Max) => {
                        dst.iter_mut().zip(got).for_each(|(a, b)| *a = a.max(*b))
                    }
                }
            }
            self.end_round();
        }
        Ok(())
    }

    /// This rank's part of a broadcast schedule of the whole tensor `t` (every transfer
    /// carries all of it), as collective `name`.
    pub fn broadcast_plan(&mut self, name: &str, plan: &Plan, t: &mut Tensor) {
        self.begin(name);
        let me = self.rank;
        let (n, es) = (t.len(), t.dtype().size_bytes());
        for (k, round) in plan.rounds.iter().enumerate() {
            let what = format!("{name}, round {k}");
            let sending: Vec<usize> = round
                .iter()
                .filter(|x| x.src == me)
                .map(|x| x.dst)
                .collect();
            let from = round.iter().find(|x| x.dst == me).map(|x| x.src);
            match from {
                Some(src) => {
                    let mut recvs = [(src, tensor_bytes_mut(t, 0..n))];
                    self.exchange(&[], &mut recvs, &what, || ());
                    self.count_recv(n, n * es);
                }
                None if !sending.is_empty() => {
                    let bytes = tensor_bytes(t, 0..n);
                    let sends: Vec<(usize, &[u8])> = sending.iter().map(|&d| (d, bytes)).collect();
                    self.exchange(&sends, &mut [], &what, || ());
                    for _ in &sending {
                        self.count_send(n, n * es);
                    }
                }
                None => {}
            }
            self.end_round();
        }
    }

    /// The library's broadcast (MPI_Ibcast) of `t` from `root`; the library picks the
    /// algorithm, so nothing is counted.
    pub fn library_broadcast(&mut self, name: &str, root: usize, t: &mut Tensor) {
        maybe_stall(self.rank);
        let n = t.len();
        let t0 = Instant::now();
        let world = &self.world;
        mpi::request::scope(|sc| {
            let r = world
                .process_at_rank(root as i32)
                .immediate_broadcast_into(sc, tensor_bytes_mut(t, 0..n));
            wait_all(world, vec![r], name);
        });
        self.comm += t0.elapsed();
    }

    /// The library's allreduce (MPI_Iallreduce) of `buf`; not counted (the library picks the
    /// algorithm: its traffic is not ours to count).
    pub fn library_allreduce(&mut self, name: &str, buf: &mut [f32], op: Reduce) {
        maybe_stall(self.rank);
        let send = buf.to_vec();
        let t0 = Instant::now();
        let world = &self.world;
        mpi::request::scope(|sc| {
            let r = match op {
                Reduce::Sum => {
                    world.immediate_all_reduce_into(sc, &send[..], buf, SystemOperation::sum())
                }
                Reduce::Max => {
                    world.immediate_all_reduce_into(sc, &send[..], buf, SystemOperation::max())
                }
            };
            wait_all(world, vec![r], name);
        });
        self.comm += t0.elapsed();
    }

    /// Waits until every rank gets here (MPI_Ibarrier, polled), off the communication
    /// clock: placed before a collective, it keeps the wait for the slowest rank's compute
    /// out of `comm_time_s`, which then measures the transfers (as MPI benchmarks time
    /// collectives after a barrier). Costs one barrier's latency in the step time.
    pub fn sync(&mut self, what: &str) {
        maybe_stall(self.rank);
        let world = &self.world;
        mpi::request::scope(|sc| {
            let r = world.immediate_barrier().shrink_scope_to(sc);
            wait_all(world, vec![r], what);
        });
    }

    /// Every rank's `mine` (equal lengths), rank by rank.
    fn all_gather(&self, mine: &[u64], what: &str) -> Vec<u64> {
        let mut all = vec![0u64; mine.len() * self.p];
        let world = &self.world;
        mpi::request::scope(|sc| {
            let r = world.immediate_all_gather_into(sc, mine, &mut all[..]);
            wait_all(world, vec![r], what);
        });
        all
    }

    /// Ends the call: records this rank's communication time for the timed-call median.
    pub fn close(self) -> Duration {
        super::record_call_comm(self.comm.as_secs_f64());
        self.comm
    }

    /// Ends a counted call: gathers every rank's counters, peak memory, work per step and
    /// median communication time into the simulation's `SimStats` (so the record is filled
    /// the same way). `counted` is false when the library's collectives did the moving.
    pub fn finish(self, memory: &DeviceMemory, work: &[u64], counted: bool) -> Result<SimStats> {
        let p = self.p;
        let rank = self.rank;
        let world = SimpleCommunicator::world();
        let log = self.log.clone();
        // The timed calls' median; the checked call itself (which also gathers) only when
        // nothing was timed.
        let median = super::take_median_call_comm().unwrap_or(self.comm.as_secs_f64());
        let mut mine = Vec::new();
        for c in &log {
            for t in [&c.sent[rank], &c.received[rank]] {
                mine.extend([t.messages, t.elements, t.bytes, t.rounds]);
            }
        }
        mine.extend([memory.peak_elements, memory.peak_bytes, median.to_bits()]);
        mine.extend(work);
        let link = Link {
            world,
            rank,
            p,
            log: Vec::new(),
            sent_this_round: false,
            received_this_round: false,
            comm: Duration::ZERO,
        };
        let all = link.all_gather(&mine, "gathering the counters");
        let per = mine.len();
        let mut collectives = log;
        let mut memories = vec![DeviceMemory::default(); p];
        let mut times = Vec::with_capacity(p);
        let mut steps = vec![vec![0u64; p]; work.len()];
        for r in 0..p {
            let row = &all[r * per..(r + 1) * per];
            let mut it = row.iter().copied();
            let mut next = || {
                it.next()
                    .ok_or_else(|| Error::Runtime("MPI counters: short gather".into()))
            };
            for c in collectives.iter_mut() {
                for t in [&mut c.sent[r], &mut c.received[r]] {
                    *t = Traffic {
                        messages: next()?,
                        elements: next()?,
                        bytes: next()?,
                        rounds: next()?,
                    };
                }
            }
            memories[r].peak_elements = next()?;
            memories[r].peak_bytes = next()?;
            times.push(f64::from_bits(next()?));
            for s in steps.iter_mut() {
                s[r] = next()?;
            }
        }
        let max = times.iter().copied().fold(0.0, f64::max);
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        Ok(SimStats {
            collectives: if counted { collectives } else { Vec::new() },
            memory: memories,
            work: steps,
            comm_time_s: Some(max),
            comm_time_min_s: Some(min),
            uncounted: !counted,
            ..SimStats::default()
        })
    }
}
