//! Writes to a results directory that survive a crash, a full disk or a second writer:
//! atomic replacement (write a sibling, then rename), a torn last line of an appended CSV
//! cut off before appending, and one writer per directory (an advisory `flock` on the
//! directory). Each costs one small extra read or system call per file opened.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{Error, Result};

/// Replaces `path` with `bytes` at once: written to a sibling file, flushed to disk, then
/// renamed over it, so a full disk or a crash leaves the old file or the new one, never a
/// truncated mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format!("cannot write {}", path.display()), e)
    })
}

/// What [`end_on_a_whole_line`] did to a file whose last line had no newline.
#[derive(Clone, Debug, PartialEq)]
pub enum Tail {
    /// The file was empty or ended in a newline: unchanged.
    Whole,
    /// The last line is a complete row without its newline (a hand edit): a newline was added.
    Completed,
    /// The last line was cut short (a crash or full disk mid-write): it was removed; here it is.
    Removed(String),
}

/// Makes `path` end in a newline before rows are appended to it. Every row attnbench writes
/// ends in one, so a last line without it was not finished: if `is_complete` accepts it,
/// it is kept and completed; otherwise it is cut off. Files that do not exist are left alone.
pub fn end_on_a_whole_line(path: &Path, is_complete: impl Fn(&str) -> bool) -> Result<Tail> {
    let io = |e| Error::io(format!("cannot repair {}", path.display()), e);
    let mut f = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Tail::Whole),
        Err(e) => return Err(io(e)),
    };
    let mut text = Vec::new();
    f.read_to_end(&mut text).map_err(io)?;
    if text.last().is_none_or(|&b| b == b'\n') {
        return Ok(Tail::Whole);
    }
    let start = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let last = String::from_utf8_lossy(&text[start..]).into_owned();
    if start > 0 && is_complete(&last) {
        f.seek(SeekFrom::End(0)).map_err(io)?;
        f.write_all(b"\n").map_err(io)?;
        return Ok(Tail::Completed);
    }
    f.set_len(start as u64).map_err(io)?;
    Ok(Tail::Removed(last))
}

/// Whether `line` is one whole CSV row of type `T` under `header` (the file's first line).
pub fn is_whole_row<T: serde::de::DeserializeOwned>(header: &str, line: &str) -> bool {
    let text = format!("{header}\n{line}\n");
    let mut r = ::csv::Reader::from_reader(text.as_bytes());
    let fields = r.headers().map_or(0, |h| h.len());
    let mut rows = r.records();
    match (rows.next(), rows.next()) {
        (Some(Ok(rec)), None) => rec.len() == fields && rec.deserialize::<T>(None).is_ok(),
        _ => false,
    }
}

/// The first line of a file (its CSV header), without the newline.
pub fn first_line(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    Ok(text.lines().next().unwrap_or("").to_string())
}

/// The exclusive right to write into a results directory, held until dropped. Two sweeps
/// writing one directory would interleave their rows; the second is refused instead.
#[derive(Debug)]
pub struct DirLock {
    _dir: Option<File>,
}

impl DirLock {
    /// Locks `dir` (which must exist). Where a directory cannot be opened as a file (not
    /// Unix) there is no lock and this succeeds.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        if !cfg!(unix) {
            return Ok(DirLock { _dir: None });
        }
        let handle =
            File::open(dir).map_err(|e| Error::io(format!("cannot open {}", dir.display()), e))?;
        match handle.try_lock() {
            Ok(()) => Ok(DirLock { _dir: Some(handle) }),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::Usage(format!(
                "{} is being written by another attnbench sweep: wait for it to finish, or use \
                 another --out",
                dir.display()
            ))),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(Error::io(format!("cannot lock {}", dir.display()), e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Pair {
        name: String,
        n: u32,
    }

    fn whole(line: &str) -> bool {
        is_whole_row::<Pair>("name,n", line)
    }

    #[test]
    fn whole_rows_have_every_field_and_parse() {
        assert!(whole("a,1"));
        assert!(!whole("a,"));
        assert!(!whole("a"));
        assert!(!whole("a,1,2"));
        assert!(!whole("a,x"));
        assert!(!whole("\"a,1"));
    }

    #[test]
    fn a_torn_last_line_is_cut_and_a_whole_one_completed() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("t.csv");
        let check = |content: &str, want: Tail, after: &str| {
            std::fs::write(&p, content).unwrap();
            assert_eq!(end_on_a_whole_line(&p, whole).unwrap(), want, "{content:?}");
            assert_eq!(std::fs::read_to_string(&p).unwrap(), after, "{content:?}");
        };
        check("name,n\na,1\n", Tail::Whole, "name,n\na,1\n");
        check("", Tail::Whole, "");
        check("name,n\na,1", Tail::Completed, "name,n\na,1\n");
        check(
            "name,n\na,1\nb,",
            Tail::Removed("b,".into()),
            "name,n\na,1\n",
        );
        // A header cut short is not a row: the file is emptied and rewritten by its sink.
        check("nam", Tail::Removed("nam".into()), "");
        assert_eq!(
            end_on_a_whole_line(&tmp.path().join("absent.csv"), whole).unwrap(),
            Tail::Whole
        );
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("meta.json");
        write_atomic(&p, b"old").unwrap();
        write_atomic(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
        // A directory in the way: an error, and the temporary is gone.
        let d = tmp.path().join("dir");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("x"), b"x").unwrap();
        assert!(write_atomic(&d, b"data").is_err());
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 2);
    }

    #[cfg(unix)]
    #[test]
    fn a_second_writer_is_refused_until_the_first_lets_go() {
        let tmp = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(tmp.path()).unwrap();
        let err = DirLock::acquire(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("another attnbench sweep"), "{err}");
        drop(first);
        DirLock::acquire(tmp.path()).unwrap();
    }
}
