//! The worker protocol's tensor files: raw little-endian f32 in C order, no header (the
//! shapes travel in the request). Any storage dtype widens to f32 exactly, so a worker
//! rounds the values back without loss. Cost: one pass over the tensor, one buffer of its
//! bytes.

use std::path::Path;

use crate::error::{Error, Result};
use crate::problem::Tensor;

/// `n` values from a raw f32 file; a file of another size is an input error.
pub fn read_f32(path: &Path, n: usize) -> Result<Vec<f32>> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if bytes.len() != 4 * n {
        return Err(Error::Input {
            path: path.to_path_buf(),
            msg: format!("{} bytes, expected {} ({n} f32 values)", bytes.len(), 4 * n),
        });
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Writes a tensor's values widened to f32.
pub fn write(path: &Path, t: &Tensor) -> Result<()> {
    let mut bytes = Vec::with_capacity(4 * t.len());
    t.for_each_f32(|x| bytes.extend_from_slice(&x.to_le_bytes()));
    std::fs::write(path, bytes).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}
