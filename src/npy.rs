//! NumPy `.npy` interop for `run --inputs DIR`, `--save-inputs DIR` and `--save-output FILE`:
//! headers via `npyz`, data streamed through a 64 KiB buffer, so time is linear in the
//! tensor and extra memory is that buffer (plus the loaded tensor itself).
//!
//! # Files and dtypes
//!
//! An input directory holds `q.npy` (shape `[batch, heads, seq_q, head_dim]`), `k.npy` and
//! `v.npy` (both `[batch, kv_heads, seq_kv, head_dim]`), C order, little-endian, one dtype
//! for all three:
//!
//! | dtype  | storage                                                                  |
//! |--------|--------------------------------------------------------------------------|
//! | `<f4`  | f32                                                                      |
//! | `<f2`  | f16                                                                      |
//! | `<u2`  | bf16, as its raw 16 bits (NumPy has no bf16; `torch_tensor.view(torch.int16).numpy().view(np.uint16)`) |
//! | `<f8`  | f64 on load only, rounded to the nearest f32 (ties to even; overflow to ±inf) and stored as f32 |
//!
//! `save_inputs` writes each storage dtype as its row above (never `<f8`), so saving and
//! loading round-trips bit for bit. Writers refuse to overwrite an existing file (nothing a
//! user produced is silently replaced).

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use npyz::{Endianness, NpyHeader, Order, TypeChar, TypeStr, WriteOptions, WriterBuilder};

use crate::error::{Error, Result};
use crate::problem::{Inputs, Shape, Tensor};

/// File names inside an inputs directory.
pub const Q_FILE: &str = "q.npy";
pub const K_FILE: &str = "k.npy";
pub const V_FILE: &str = "v.npy";

/// Bytes streamed per read or write call.
const IO_CHUNK_BYTES: usize = 64 << 10;

const ACCEPTED: &str =
    "expected little-endian '<f4' (f32), '<f2' (f16), '<u2' (bf16 bits) or '<f8' (f64, rounded to f32)";

/// Writes `q.npy`, `k.npy` and `v.npy` into `dir` (created if missing) in the inputs'
/// storage dtype: f32 as `<f4`, f16 as `<f2`, bf16 as `<u2` (raw bits). Fails without
/// writing anything if any of the three files already exists.
pub fn save_inputs(dir: &Path, inputs: &Inputs) -> Result<()> {
    let s = &inputs.shape;
    let q_shape = [s.batch, s.heads, s.seq_q, s.head_dim];
    let kv_shape = [s.batch, s.kv_heads, s.seq_kv, s.head_dim];
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating directory {}", dir.display()), e))?;
    let files = [
        (dir.join(Q_FILE), &inputs.q, q_shape),
        (dir.join(K_FILE), &inputs.k, kv_shape),
        (dir.join(V_FILE), &inputs.v, kv_shape),
    ];
    for (path, tensor, shape) in &files {
        if tensor.len() != shape.iter().product::<usize>() {
            return Err(Error::Runtime(format!(
                "{}: tensor has {} elements, shape {shape:?} needs {}",
                path.display(),
                tensor.len(),
                shape.iter().product::<usize>()
            )));
        }
        refuse_existing(path)?;
    }
    for (path, tensor, shape) in &files {
        match tensor {
            Tensor::F32(v) => write_npy(path, "<f4", shape, v, |x| x.to_le_bytes()),
            Tensor::F16(v) => write_npy(path, "<f2", shape, v, |x| x.to_bits().to_le_bytes()),
            Tensor::Bf16(v) => write_npy(path, "<u2", shape, v, |x| x.to_bits().to_le_bytes()),
        }?;
    }
    Ok(())
}

/// Reads `q.npy`, `k.npy` and `v.npy` from `dir` (dtypes in the module doc) and checks them
/// against `expected`. All three headers are validated before any data is read. Every
/// failure is an [`Error::Input`] naming the file and what was expected.
pub fn load_inputs(dir: &Path, expected: &Shape) -> Result<Inputs> {
    let e = expected;
    let q_dims = [
        ("batch", e.batch, "--batch"),
        ("heads", e.heads, "--heads"),
        ("seq_q", e.seq_q, "--seq-len"),
        ("head_dim", e.head_dim, "--head-dim"),
    ];
    let kv_dims = [
        ("batch", e.batch, "--batch"),
        ("kv_heads", e.kv_heads, "--kv-heads"),
        ("seq_kv", e.seq_kv, "--seq-len"),
        ("head_dim", e.head_dim, "--head-dim"),
    ];
    let q = NpyIn::open(&dir.join(Q_FILE))?;
    let k = NpyIn::open(&dir.join(K_FILE))?;
    let v = NpyIn::open(&dir.join(V_FILE))?;
    let kind = q.input_kind()?;
    for f in [&k, &v] {
        let other = f.input_kind()?;
        if other != kind {
            return Err(f.err(format!(
                "dtype '{}' differs from {Q_FILE}'s '{}'; q, k and v must share one dtype",
                other.descr(),
                kind.descr()
            )));
        }
    }
    q.check_shape(&q_dims)?;
    k.check_shape(&kv_dims)?;
    v.check_shape(&kv_dims)?;
    Ok(Inputs {
        shape: *expected,
        q: q.read_tensor(kind)?,
        k: k.read_tensor(kind)?,
        v: v.read_tensor(kind)?,
        paged: Vec::new(),
        fp8: Vec::new(),
        mla: None,
    })
}

/// Writes `data` as a C-order `<f4` array of `shape` (the parent directory is created if
/// missing). Refuses to overwrite an existing file.
pub fn save_f32(path: &Path, data: &[f32], shape: &[usize]) -> Result<()> {
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if n != Some(data.len()) {
        return Err(Error::Runtime(format!(
            "{}: {} values do not fill shape {shape:?}",
            path.display(),
            data.len()
        )));
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("creating directory {}", parent.display()), e))?;
    }
    refuse_existing(path)?;
    write_npy(path, "<f4", shape, data, |x| x.to_le_bytes())
}

/// Reads a C-order little-endian `<f4` array of any rank: the values and the shape.
pub fn load_f32(path: &Path) -> Result<(Vec<f32>, Vec<usize>)> {
    let f = NpyIn::open(path)?;
    let shape = f.shape_usize()?;
    match f.plain_kind()? {
        Some(Kind::F4) => {}
        _ => {
            return Err(f.err(format!(
                "dtype '{}' is not supported here; expected little-endian '<f4' (f32)",
                f.descr()
            )))
        }
    }
    let data = f.read_elems(|b: [u8; 4]| f32::from_le_bytes(b))?;
    Ok((data, shape))
}

/// The dtypes this module reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    F4,
    F2,
    U2,
    F8,
}

impl Kind {
    fn descr(self) -> &'static str {
        match self {
            Kind::F4 => "<f4",
            Kind::F2 => "<f2",
            Kind::U2 => "<u2",
            Kind::F8 => "<f8",
        }
    }
}

/// An opened `.npy` file: parsed header, reader at the first data byte, data bytes present.
struct NpyIn {
    path: PathBuf,
    header: NpyHeader,
    reader: BufReader<File>,
    data_bytes: u64,
}

impl NpyIn {
    fn open(path: &Path) -> Result<NpyIn> {
        let input_err = |msg: String| Error::Input {
            path: path.to_path_buf(),
            msg,
        };
        let file = File::open(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => input_err(format!(
                "file not found (an inputs directory holds {Q_FILE}, {K_FILE} and {V_FILE})"
            )),
            _ => input_err(format!("cannot open: {e}")),
        })?;
        let file_len = file
            .metadata()
            .map_err(|e| input_err(format!("cannot stat: {e}")))?
            .len();
        let mut reader = BufReader::new(file);
        let header = NpyHeader::from_reader(&mut reader).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => {
                input_err("not a valid .npy file: the header is cut short".into())
            }
            _ => input_err(format!("not a valid .npy file: {e}")),
        })?;
        let pos = reader
            .stream_position()
            .map_err(|e| input_err(format!("cannot read: {e}")))?;
        Ok(NpyIn {
            path: path.to_path_buf(),
            header,
            reader,
            data_bytes: file_len.saturating_sub(pos),
        })
    }

    fn err(&self, msg: String) -> Error {
        Error::Input {
            path: self.path.clone(),
            msg,
        }
    }

    fn descr(&self) -> String {
        match self.header.dtype() {
            npyz::DType::Plain(ts) => ts.to_string(),
            other => other.descr(),
        }
    }

    /// The dtype when it is one of ours and little-endian; `None` for any other dtype.
    /// Fortran order is an error here, since every reader needs C order.
    fn plain_kind(&self) -> Result<Option<Kind>> {
        if self.header.order() == Order::Fortran {
            return Err(self.err(
                "array is in Fortran order; expected C order (save np.ascontiguousarray(a))".into(),
            ));
        }
        let npyz::DType::Plain(ts) = self.header.dtype() else {
            return Ok(None);
        };
        Ok(kind_of(&ts))
    }

    /// The dtype of an input tensor, or an error saying which ones are accepted.
    fn input_kind(&self) -> Result<Kind> {
        match self.plain_kind()? {
            Some(k) => Ok(k),
            None => {
                let big = matches!(self.header.dtype(),
                    npyz::DType::Plain(ts) if ts.endianness() == Endianness::Big);
                let hint = if big {
                    " (big-endian: convert with a.astype(a.dtype.newbyteorder('<')))"
                } else {
                    ""
                };
                Err(self.err(format!(
                    "dtype '{}' is not supported{hint}; {ACCEPTED}",
                    self.descr()
                )))
            }
        }
    }

    fn shape_usize(&self) -> Result<Vec<usize>> {
        self.header
            .shape()
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| self.err(format!("shape {:?} is too large", self.header.shape())))
    }

    /// Checks a 4-d shape against `dims` = (axis name, expected size, flag that sets it).
    fn check_shape(&self, dims: &[(&str, usize, &str); 4]) -> Result<()> {
        let found = self.header.shape();
        let names: Vec<&str> = dims.iter().map(|d| d.0).collect();
        let want: Vec<u64> = dims.iter().map(|d| d.1 as u64).collect();
        if found.len() != 4 {
            return Err(self.err(format!(
                "expected a 4-d array [{}] = {want:?}, found {}-d shape {found:?}",
                names.join(", "),
                found.len()
            )));
        }
        let mismatches: Vec<String> = dims
            .iter()
            .zip(found)
            .filter(|((_, w, _), &f)| *w as u64 != f)
            .map(|((name, w, flag), f)| {
                format!("{name} is {f} in the file but {w} was asked for ({flag})")
            })
            .collect();
        if mismatches.is_empty() {
            return Ok(());
        }
        Err(self.err(format!(
            "shape {found:?} does not match the expected [{}] = {want:?}: {}",
            names.join(", "),
            mismatches.join("; ")
        )))
    }

    fn read_tensor(self, kind: Kind) -> Result<Tensor> {
        let path = self.path.clone();
        let tensor = match kind {
            Kind::F4 => Tensor::F32(self.read_elems(|b: [u8; 4]| f32::from_le_bytes(b))?),
            Kind::F2 => {
                Tensor::F16(self.read_elems(|b: [u8; 2]| f16::from_bits(u16::from_le_bytes(b)))?)
            }
            Kind::U2 => {
                Tensor::Bf16(self.read_elems(|b: [u8; 2]| bf16::from_bits(u16::from_le_bytes(b)))?)
            }
            Kind::F8 => Tensor::F32(self.read_elems(|b: [u8; 8]| f64::from_le_bytes(b) as f32)?),
        };
        // A NaN or infinite input (or an f64 past f32's range) would give a NaN output that
        // the oracle cannot judge: refused, naming the file and the first such element.
        let bad = match &tensor {
            Tensor::F32(x) => x.iter().position(|v| !v.is_finite()),
            Tensor::F16(x) => x.iter().position(|v| !v.is_finite()),
            Tensor::Bf16(x) => x.iter().position(|v| !v.is_finite()),
        };
        match bad {
            Some(i) => Err(Error::Input {
                path,
                msg: format!("element {i} is NaN or infinite (in the file's storage dtype); inputs must be finite"),
            }),
            None => Ok(tensor),
        }
    }

    /// Reads every element (`N` bytes each, decoded by `conv`), checking first that the file
    /// holds exactly the bytes the header promises.
    fn read_elems<const N: usize, T>(mut self, conv: impl Fn([u8; N]) -> T) -> Result<Vec<T>> {
        let count = self.header.len();
        let need = count.checked_mul(N as u64);
        match need {
            Some(need) if need == self.data_bytes => {}
            Some(need) if need > self.data_bytes => {
                return Err(self.err(format!(
                    "truncated: shape {:?} needs {need} bytes of data, the file holds {}",
                    self.header.shape(),
                    self.data_bytes
                )))
            }
            Some(need) => {
                return Err(self.err(format!(
                    "corrupt: {} bytes after the {need} bytes of data that shape {:?} needs",
                    self.data_bytes - need,
                    self.header.shape()
                )))
            }
            None => return Err(self.err(format!("shape {:?} is too large", self.header.shape()))),
        }
        let count = usize::try_from(count)
            .map_err(|_| self.err(format!("shape {:?} is too large", self.header.shape())))?;
        let mut out: Vec<T> = Vec::new();
        out.try_reserve_exact(count).map_err(|_| {
            Error::OutOfMemory(format!(
                "{} elements to load {}",
                count,
                self.path.display()
            ))
        })?;
        let mut buf = vec![0u8; IO_CHUNK_BYTES];
        let per_chunk = IO_CHUNK_BYTES / N;
        let mut left = count;
        while left > 0 {
            let k = left.min(per_chunk);
            let bytes = &mut buf[..k * N];
            self.reader
                .read_exact(bytes)
                .map_err(|e| self.err(format!("cannot read the data: {e}")))?;
            out.extend(bytes.chunks_exact(N).map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                conv(a)
            }));
            left -= k;
        }
        Ok(out)
    }
}

/// Our dtypes by their type string; `None` for anything else (big-endian included).
fn kind_of(ts: &TypeStr) -> Option<Kind> {
    if ts.endianness() != Endianness::Little {
        return None;
    }
    match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 4) => Some(Kind::F4),
        (TypeChar::Float, 2) => Some(Kind::F2),
        (TypeChar::Uint, 2) => Some(Kind::U2),
        (TypeChar::Float, 8) => Some(Kind::F8),
        _ => None,
    }
}

/// The error `save_inputs` would give for `dir` because one of its files exists, checked
/// before anything is measured.
pub fn check_inputs_absent(dir: &Path) -> Result<()> {
    // A file where the directory goes would fail only after the measurement.
    if dir.exists() && !dir.is_dir() {
        return Err(Error::Usage(format!(
            "--save-inputs {}: exists and is not a directory",
            dir.display()
        )));
    }
    [Q_FILE, K_FILE, V_FILE]
        .into_iter()
        .try_for_each(|f| refuse_existing(&dir.join(f)))
}

/// A usage error if `path` exists: the files this module writes never replace one.
pub fn refuse_existing(path: &Path) -> Result<()> {
    if path.exists() {
        return Err(Error::Usage(format!(
            "{}: already exists; refusing to overwrite it (remove it or choose another path)",
            path.display()
        )));
    }
    Ok(())
}

/// Writes a C-order `.npy` of `descr` and `shape` whose elements `encode` turns into their
/// little-endian bytes. The file must not exist; a partly written file is removed.
fn write_npy<T: Copy, const N: usize>(
    path: &Path,
    descr: &str,
    shape: &[usize],
    data: &[T],
    encode: impl Fn(T) -> [u8; N],
) -> Result<()> {
    let ctx = || format!("writing {}", path.display());
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => Error::Usage(format!(
                "{}: already exists; refusing to overwrite it (remove it or choose another path)",
                path.display()
            )),
            _ => Error::io(ctx(), e),
        })?;
    let result = write_body(file, descr, shape, data, encode);
    if let Err(e) = result {
        let _ = std::fs::remove_file(path);
        return Err(Error::io(ctx(), e));
    }
    Ok(())
}

fn write_body<T: Copy, const N: usize>(
    file: File,
    descr: &str,
    shape: &[usize],
    data: &[T],
    encode: impl Fn(T) -> [u8; N],
) -> io::Result<()> {
    let ts: TypeStr = descr
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let mut w = WriteOptions::new_header_only()
        .dtype(npyz::DType::Plain(ts))
        .shape(&shape)
        .writer(BufWriter::with_capacity(IO_CHUNK_BYTES, file))
        .write_header_only()?;
    let mut buf: Vec<u8> = Vec::with_capacity(IO_CHUNK_BYTES);
    for chunk in data.chunks(IO_CHUNK_BYTES / N) {
        buf.clear();
        for &x in chunk {
            buf.extend_from_slice(&encode(x));
        }
        w.write_all(&buf)?;
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{DType, InputDist};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(name: &str) -> TempDir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "attnbench-npy-{}-{name}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn shape() -> Shape {
        Shape {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            seq_q: 3,
            seq_kv: 5,
            head_dim: 8,
        }
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        match t {
            Tensor::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            Tensor::F16(v) => v.iter().map(|x| x.to_bits() as u32).collect(),
            Tensor::Bf16(v) => v.iter().map(|x| x.to_bits() as u32).collect(),
        }
    }

    /// Writes a `.npy` with npyz's own writer (a third-party producer).
    fn write_with_npyz<T: npyz::Serialize>(
        path: &Path,
        descr: &str,
        shape: &[u64],
        order: Order,
        data: &[T],
    ) {
        let file = BufWriter::new(File::create(path).unwrap());
        let mut w = WriteOptions::new()
            .dtype(npyz::DType::Plain(descr.parse().unwrap()))
            .shape(shape)
            .order(order)
            .writer(file)
            .begin_nd()
            .unwrap();
        for x in data {
            w.push(x).unwrap();
        }
        w.finish().unwrap();
    }

    fn input_msg(r: Result<Inputs>) -> (PathBuf, String) {
        match r {
            Err(Error::Input { path, msg }) => (path, msg),
            other => panic!("expected Error::Input, got {other:?}"),
        }
    }

    #[test]
    fn round_trip_is_bit_exact_per_dtype() {
        for dtype in DType::ALL {
            let dir = TempDir::new(dtype.name());
            let mut inputs = Inputs::generate(shape(), dtype, InputDist::Normal, 3.0, 11);
            // Finite specials survive too (NaN and inf are refused on load: see
            // non_finite_inputs_are_refused_naming_file_and_element).
            if let Tensor::F32(v) = &mut inputs.q {
                v[0] = f32::MAX;
                v[1] = -0.0;
                v[2] = f32::MIN;
                v[3] = f32::from_bits(1); // subnormal
            }
            save_inputs(&dir.0, &inputs).unwrap();
            let back = load_inputs(&dir.0, &shape()).unwrap();
            assert_eq!(back.dtype(), dtype);
            assert_eq!(back.shape, inputs.shape);
            for (a, b) in [
                (&inputs.q, &back.q),
                (&inputs.k, &back.k),
                (&inputs.v, &back.v),
            ] {
                assert_eq!(bits(a), bits(b), "{dtype}");
            }
        }
    }

    #[test]
    fn saved_files_are_standard_npy() {
        let dir = TempDir::new("standard");
        let inputs = Inputs::generate(shape(), DType::F16, InputDist::Uniform, 1.0, 1);
        save_inputs(&dir.0, &inputs).unwrap();
        let bytes = std::fs::read(dir.0.join(Q_FILE)).unwrap();
        assert!(bytes.starts_with(b"\x93NUMPY"));
        let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
        assert_eq!(npy.shape(), &[2, 4, 3, 8]);
        assert_eq!(npy.order(), Order::C);
        let vals: Vec<f16> = npy.into_vec().unwrap();
        let Tensor::F16(q) = &inputs.q else { panic!() };
        assert_eq!(&vals, q);
        // bf16 is stored as raw '<u2' bits.
        let dir = TempDir::new("standard-bf16");
        let inputs = Inputs::generate(shape(), DType::Bf16, InputDist::Normal, 1.0, 1);
        save_inputs(&dir.0, &inputs).unwrap();
        let bytes = std::fs::read(dir.0.join(K_FILE)).unwrap();
        let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
        assert_eq!(npy.shape(), &[2, 2, 5, 8]);
        let vals: Vec<u16> = npy.into_vec().unwrap();
        let Tensor::Bf16(k) = &inputs.k else { panic!() };
        assert_eq!(vals, k.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }

    #[test]
    fn f64_inputs_are_rounded_to_f32() {
        let dir = TempDir::new("f64");
        let s = shape();
        let qs = [2, 4, 3, 8];
        let kvs = [2, 2, 5, 8];
        let q: Vec<f64> = (0..s.q_len()).map(|i| 0.1 * i as f64).collect();
        let kv: Vec<f64> = (0..s.kv_len()).map(|i| 1.0 / (i as f64 + 3.0)).collect();
        write_with_npyz(&dir.0.join(Q_FILE), "<f8", &qs, Order::C, &q);
        write_with_npyz(&dir.0.join(K_FILE), "<f8", &kvs, Order::C, &kv);
        write_with_npyz(&dir.0.join(V_FILE), "<f8", &kvs, Order::C, &kv);
        let back = load_inputs(&dir.0, &s).unwrap();
        assert_eq!(back.dtype(), DType::F32);
        let Tensor::F32(bq) = &back.q else { panic!() };
        let Tensor::F32(bk) = &back.k else { panic!() };
        assert!(q.iter().zip(bq).all(|(&a, &b)| b == a as f32));
        assert!(kv.iter().zip(bk).all(|(&a, &b)| b == a as f32));
    }

    #[test]
    fn non_finite_inputs_are_refused_naming_file_and_element() {
        let dir = TempDir::new("nonfinite");
        let s = shape();
        let qs = [2, 4, 3, 8];
        let kvs = [2, 2, 5, 8];
        let q: Vec<f64> = vec![0.5; s.q_len()];
        let mut kv: Vec<f64> = vec![0.25; s.kv_len()];
        kv[7] = 1e300; // finite in f64, infinite once rounded to f32
        write_with_npyz(&dir.0.join(Q_FILE), "<f8", &qs, Order::C, &q);
        write_with_npyz(&dir.0.join(K_FILE), "<f8", &kvs, Order::C, &kv);
        write_with_npyz(&dir.0.join(V_FILE), "<f8", &kvs, Order::C, &kv);
        let (path, msg) = input_msg(load_inputs(&dir.0, &s));
        assert!(path.ends_with(K_FILE), "{path:?}");
        assert!(
            msg.contains("element 7") && msg.contains("NaN or infinite"),
            "{msg}"
        );
    }

    #[test]
    fn missing_file_is_named() {
        let dir = TempDir::new("missing");
        let inputs = Inputs::generate(shape(), DType::F32, InputDist::Normal, 1.0, 1);
        save_inputs(&dir.0, &inputs).unwrap();
        std::fs::remove_file(dir.0.join(V_FILE)).unwrap();
        let (path, msg) = input_msg(load_inputs(&dir.0, &shape()));
        assert!(path.ends_with(V_FILE), "{path:?}");
        assert!(msg.contains("not found"), "{msg}");
    }

    #[test]
    fn truncated_and_padded_files_are_errors() {
        let dir = TempDir::new("truncated");
        let inputs = Inputs::generate(shape(), DType::F32, InputDist::Normal, 1.0, 1);
        save_inputs(&dir.0, &inputs).unwrap();
        let k = dir.0.join(K_FILE);
        let bytes = std::fs::read(&k).unwrap();
        std::fs::write(&k, &bytes[..bytes.len() - 3]).unwrap();
        let (path, msg) = input_msg(load_inputs(&dir.0, &shape()));
        assert!(path.ends_with(K_FILE));
        assert!(msg.contains("truncated"), "{msg}");

        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0; 4]);
        std::fs::write(&k, &longer).unwrap();
        let (_, msg) = input_msg(load_inputs(&dir.0, &shape()));
        assert!(msg.contains("4 bytes after"), "{msg}");

        // A header cut short is not a valid .npy at all.
        std::fs::write(&k, &bytes[..20]).unwrap();
        let (path, msg) = input_msg(load_inputs(&dir.0, &shape()));
        assert!(path.ends_with(K_FILE));
        assert!(msg.contains("not a valid .npy"), "{msg}");
        std::fs::write(&k, b"hello, not numpy").unwrap();
        let (_, msg) = input_msg(load_inputs(&dir.0, &shape()));
        assert!(msg.contains("not a valid .npy"), "{msg}");
    }

    #[test]
    fn wrong_shape_names_both_shapes_and_the_flag() {
        let dir = TempDir::new("shape");
        let inputs = Inputs::generate(shape(), DType::F32, InputDist::Normal, 1.0, 1);
        save_inputs(&dir.0, &inputs).unwrap();
        let asked = Shape {
            seq_q: 7,
            ..shape()
        };
        let (path, msg) = input_msg(load_inputs(&dir.0, &asked));
        assert!(path.ends_with(Q_FILE));
        assert!(msg.contains("[2, 4, 3, 8]"), "{msg}");
        assert!(msg.contains("[2, 4, 7, 8]"), "{msg}");
        assert!(msg.contains("seq_q is 3 in the file but 7"), "{msg}");
        assert!(msg.contains("--seq-len"), "{msg}");

        let asked = Shape {
            kv_heads: 1,
            ..shape()
        };
        let (path, msg) = input_msg(load_inputs(&dir.0, &asked));
        assert!(path.ends_with(K_FILE));
        assert!(msg.contains("--kv-heads"), "{msg}");
    }

    #[test]
    fn wrong_ndim_is_an_error() {
        let dir = TempDir::new("ndim");
        let inputs = Inputs::generate(shape(), DType::F32, InputDist::Normal, 1.0, 1);
        save_inputs(&dir.0, &inputs).unwrap();
        let q = dir.0.join(Q_FILE);
        std::fs::remove_file(&q).unwrap();
        let Tensor::F32(data) = &inputs.q else {
            panic!()
        };
        save_f32(&q, data, &[8, 3, 8]).unwrap();
        let (path, msg) = input_msg(load_inputs(&dir.0, &shape()));
        assert!(path.ends_with(Q_FILE));
        assert!(msg.contains("4-d") && msg.contains("3-d"), "{msg}");
    }

    #[test]
    fn dtype_mismatch_between_files() {
        let dir = TempDir::new("mixed");
        let a = Inputs::generate(shape(), DType::F32, InputDist::Normal, 1.0, 1);
        save_inputs(&dir.0, &a).unwrap();
        let other = TempDir::new("mixed-f16");
        let b = Inputs::generate(shape(), DType::F16, InputDist::Normal, 1.0, 1);
        save_inputs(&other.0, &b).unwrap();
        std::fs::remove_file(dir.0.join(V_FILE)).unwrap();
        std::fs::copy(other.0.join(V_FILE), dir.0.join(V_FILE)).unwrap();
        let (path, msg) = input_msg(load_inputs(&dir.0, &shape()));
        assert!(path.ends_with(V_FILE));
        assert!(msg.contains("'<f2'") && msg.contains("'<f4'"), "{msg}");
    }

    #[test]
    fn unsupported_layouts_and_dtypes() {
        let s = shape();
        let cases: [(&str, Order, &str); 3] = [
            (">f4", Order::C, "big-endian"),
            ("<f4", Order::Fortran, "Fortran"),
            ("<i4", Order::C, "'<i4' is not supported"),
        ];
        for (descr, order, needle) in cases {
            let dir = TempDir::new("layout");
            let inputs = Inputs::generate(s, DType::F32, InputDist::Normal, 1.0, 1);
            save_inputs(&dir.0, &inputs).unwrap();
            let q = dir.0.join(Q_FILE);
            std::fs::remove_file(&q).unwrap();
            if descr == "<i4" {
                write_with_npyz(&q, descr, &[2, 4, 3, 8], order, &vec![1i32; s.q_len()]);
            } else {
                write_with_npyz(&q, descr, &[2, 4, 3, 8], order, &vec![1f32; s.q_len()]);
            }
            let (path, msg) = input_msg(load_inputs(&dir.0, &s));
            assert!(path.ends_with(Q_FILE));
            assert!(msg.contains(needle), "{descr}: {msg}");
        }
    }

    #[test]
    fn f32_output_round_trip_and_no_overwrite() {
        let dir = TempDir::new("out");
        let path = dir.0.join("sub").join("o.npy");
        let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        save_f32(&path, &data, &[2, 3, 4]).unwrap();
        let (back, shape) = load_f32(&path).unwrap();
        assert_eq!(back, data);
        assert_eq!(shape, vec![2, 3, 4]);
        assert!(matches!(
            save_f32(&path, &data, &[24]),
            Err(Error::Usage(m)) if m.contains("already exists")
        ));
        assert!(save_f32(&dir.0.join("bad.npy"), &data, &[5, 5]).is_err());
        // load_f32 accepts '<f4' only.
        let f16_path = dir.0.join("h.npy");
        write_with_npyz(&f16_path, "<f2", &[2], Order::C, &[f16::ONE, f16::ZERO]);
        assert!(matches!(load_f32(&f16_path), Err(Error::Input { .. })));
    }

    #[test]
    fn save_inputs_refuses_to_overwrite() {
        let dir = TempDir::new("overwrite");
        let inputs = Inputs::generate(shape(), DType::F32, InputDist::Normal, 1.0, 1);
        save_inputs(&dir.0, &inputs).unwrap();
        let before = std::fs::read(dir.0.join(Q_FILE)).unwrap();
        let other = Inputs::generate(shape(), DType::F32, InputDist::Normal, 1.0, 2);
        assert!(matches!(save_inputs(&dir.0, &other), Err(Error::Usage(_))));
        assert_eq!(std::fs::read(dir.0.join(Q_FILE)).unwrap(), before);
    }
}
