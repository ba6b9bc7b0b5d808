//! Attention across real devices (issue 10): Ring Attention (Liu et al. 2023; docs/papers.md
//! 2.6) and Tree Attention decoding (Shyam et al. Algorithm 3; docs/papers.md, Shyam et al.) with one MPI
//! rank per device, through rsmpi behind the `mpi` feature. Each rank holds its own shard and
//! runs the same local kernels as the simulation (`sim::local`); messages go through MPI
//! (`link`: nonblocking operations polled against a deadline, so a rank that dies or hangs
//! fails the run with a message instead of hanging it, with the same per-collective
//! counters as the simulated comm layer). Cost per rank: the simulation's per device
//! (O(t * N * d) ring decode, O(t * d) tree decode) plus real transfers.
//!
//! Without the feature this module only answers "not available here", so the default build
//! needs no MPI and the MPI variants are `skipped` rows with the reason.

#[cfg(feature = "mpi")]
mod link;
#[cfg(feature = "mpi")]
pub mod ring;
#[cfg(feature = "mpi")]
pub mod tree;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

/// Seconds any one collective or point-to-point exchange may take before the run is aborted
/// (`sweep --mpi-timeout`). Generous: a rank waits at a collective for its slowest peer's
/// compute too, which at N = 1M on an oversubscribed machine takes seconds.
pub const DEFAULT_TIMEOUT_S: f64 = 300.0;

/// (rank, ranks) once MPI is initialized.
static WORLD: OnceLock<(usize, usize)> = OnceLock::new();
static TIMEOUT_BITS: AtomicU64 = AtomicU64::new(0);
/// Test hook (`sweep --mpi-test-fault`): a rank that hangs or dies at its first exchange.
static FAULT: OnceLock<Fault> = OnceLock::new();

/// A rank failure injected for the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The rank stops answering (sleeps forever).
    Stall(usize),
    /// The rank exits at once without finalizing MPI.
    Die(usize),
}

impl std::str::FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Fault, String> {
        let bad = || format!("`{s}`: expected stall:RANK or die:RANK");
        let (kind, r) = s.split_once(':').ok_or_else(bad)?;
        let r: usize = r.parse().map_err(|_| bad())?;
        match kind {
            "stall" => Ok(Fault::Stall(r)),
            "die" => Ok(Fault::Die(r)),
            _ => Err(bad()),
        }
    }
}
/// Seconds each call of an MPI variant spent in communication on this rank, since the last
/// counted (checked) call.
static CALL_COMM_S: Mutex<Vec<f64>> = Mutex::new(Vec::new());

/// This process's rank (0 when not under MPI).
pub fn rank() -> usize {
    WORLD.get().map_or(0, |w| w.0)
}

/// Ranks in the run (1 when not under MPI).
pub fn size() -> usize {
    WORLD.get().map_or(1, |w| w.1)
}

/// Whether this process writes files and progress: rank 0, or any process not under MPI.
pub fn is_root() -> bool {
    rank() == 0
}

/// Whether MPI was initialized (the process was started by mpirun and built with `mpi`).
pub fn active() -> bool {
    WORLD.get().is_some()
}

pub fn set_timeout(seconds: f64) {
    TIMEOUT_BITS.store(seconds.to_bits(), Ordering::Relaxed);
}

pub fn timeout_s() -> f64 {
    match TIMEOUT_BITS.load(Ordering::Relaxed) {
        0 => DEFAULT_TIMEOUT_S,
        b => f64::from_bits(b),
    }
}

pub fn set_fault(fault: Fault) {
    let _ = FAULT.set(fault);
}

#[cfg(feature = "mpi")]
fn fault() -> Option<Fault> {
    FAULT.get().copied()
}

/// Ranks the launcher says this process belongs to (Open MPI, MPICH/PMI, PMIx), if any.
fn launched_ranks() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
}

/// Why an MPI variant cannot run `devices` ranks in this process, if so.
pub fn unavailable(devices: usize) -> Option<String> {
    if !cfg!(feature = "mpi") {
        return Some(
            "this attnbench was built without the `mpi` feature (cargo build --release --features mpi; docs/guide/mpi.md)"
                .into(),
        );
    }
    match WORLD.get() {
        None => Some(format!(
            "MPI variants run one rank per device: start with `mpirun -np {devices} attnbench ...` (docs/guide/mpi.md)"
        )),
        Some(&(_, n)) if n != devices => Some(format!(
            "devices = {devices} but mpirun started {n} rank(s): one rank per device (--set devices={n})"
        )),
        _ => None,
    }
}

/// Keeps MPI initialized; dropping it finalizes MPI.
pub struct Session {
    #[cfg(feature = "mpi")]
    _universe: mpi::environment::Universe,
}

/// Finalizes MPI (when a session was started): the session is dropped here.
pub fn finish(_session: Option<Session>) {}

/// Initializes MPI when the process was started by an MPI launcher (mpirun sets its
/// variables); otherwise `None` and everything runs as one process. A build without the
/// feature started by mpirun with several ranks is an error: each rank would write the
/// same files.
pub fn init_if_launched() -> Result<Option<Session>> {
    let Some(n) = launched_ranks() else {
        return Ok(None);
    };
    #[cfg(feature = "mpi")]
    {
        let _ = n;
        use mpi::environment::Threading;
        // Serialized: MPI is called from one thread at a time, but not always the main one
        // (kernels and their exchanges run inside the case's rayon pool).
        let (universe, got) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| Error::Runtime("MPI was already initialized".into()))?;
        if got < Threading::Serialized {
            return Err(Error::Runtime(format!(
                "the MPI library offers thread level {got:?}; attnbench needs Serialized"
            )));
        }
        use mpi::traits::Communicator;
        let world = universe.world();
        let _ = WORLD.set((world.rank() as usize, world.size() as usize));
        // A panicking rank must take the others down at once: unwinding would finalize MPI,
        // which waits for ranks that are themselves waiting in a collective.
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default_hook(info);
            abort_all(101);
        }));
        Ok(Some(Session {
            _universe: universe,
        }))
    }
    #[cfg(not(feature = "mpi"))]
    {
        if n > 1 {
            return Err(Error::Usage(format!(
                "started by an MPI launcher with {n} ranks, but this attnbench was built without the `mpi` feature: every rank would run the whole sweep and write the same files (cargo build --release --features mpi)"
            )));
        }
        Ok(None)
    }
}

/// Ends every rank of the run now with `code` (MPI_Abort), or this process when not under
/// MPI. For a rank that fails while the others may be inside a collective.
pub fn abort_all(code: i32) -> ! {
    #[cfg(feature = "mpi")]
    if active() {
        use mpi::traits::Communicator;
        mpi::topology::SimpleCommunicator::world().abort(code)
    }
    std::process::exit(code)
}

/// Whether every rank says `ok` (a collective with a deadline); `ok` itself when not under
/// MPI. Used where only rank 0 can fail (its output directory), so the others stop too.
pub fn all_ok(ok: bool) -> Result<bool> {
    #[cfg(feature = "mpi")]
    if active() {
        return link::all_ok(ok);
    }
    Ok(ok)
}

/// Records the communication seconds of one call of an MPI variant on this rank.
pub fn record_call_comm(seconds: f64) {
    CALL_COMM_S
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(seconds);
}

/// The median of the calls recorded since the last take, and forgets them.
pub fn take_median_call_comm() -> Option<f64> {
    let mut v = std::mem::take(&mut *CALL_COMM_S.lock().unwrap_or_else(|e| e.into_inner()));
    crate::measure::stats::Summary::of(&v).map(|s| {
        v.clear();
        s.median
    })
}

/// Every recorded call's communication seconds since the last take, summed, and forgets
/// them (a generation's messages, call by call).
pub fn take_total_call_comm() -> f64 {
    std::mem::take(&mut *CALL_COMM_S.lock().unwrap_or_else(|e| e.into_inner()))
        .iter()
        .sum()
}

/// `buf` on every rank as `root` holds it (MPI_Ibcast, with the deadline); a no-op when
/// not under MPI.
pub fn broadcast_f32(root: usize, buf: &mut [f32], what: &str) -> Result<()> {
    #[cfg(feature = "mpi")]
    if active() {
        return link::broadcast_f32(root, buf, what);
    }
    let _ = (root, buf, what);
    Ok(())
}

/// The error of an MPI variant asked to run where it cannot (the runner skips such cases
/// first; this is for direct calls).
pub fn not_here(devices: usize) -> Error {
    Error::Runtime(unavailable(devices).unwrap_or_else(|| "MPI is not available".into()))
}
