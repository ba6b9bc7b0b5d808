//! The worker thread pools cases run on: one rayon pool per thread count, built once and
//! kept (a case's timed calls must not pay for starting threads). O(1) after the first call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::error::{Error, Result};

/// A rayon pool with exactly `threads` workers, built once per thread count.
pub fn pool(threads: usize) -> Result<Arc<ThreadPool>> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<ThreadPool>>>> = OnceLock::new();
    let pools = POOLS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = pools.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = map.get(&threads) {
        return Ok(p.clone());
    }
    let p = Arc::new(
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("attnbench-{i}"))
            .build()
            .map_err(|e| Error::Runtime(format!("cannot start {threads} threads: {e}")))?,
    );
    map.insert(threads, p.clone());
    Ok(p)
}
