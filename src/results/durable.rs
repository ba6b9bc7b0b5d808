//! Writes to a results directory that survive a crash, a full disk or a second writer:
//! atomic replacement (write a sibling, then rename), an unfinished last row of an appended
//! CSV cut off before appending, and one writer per directory (an advisory `flock` on a lock
//! file in it). Each costs one extra read or system call per file opened.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// The lock file a sweep holds in its results directory (see [`DirLock`]).
pub const LOCK_NAME: &str = ".attnbench.lock";

/// Whether `name` is one of the hidden files these writes leave in a results directory (the
/// lock file, the temporary of an atomic write that a crash interrupted): not results.
pub fn is_bookkeeping(name: &str) -> bool {
    name == LOCK_NAME || (name.starts_with('.') && name.ends_with(".tmp"))
}

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
    })?;
    // The rename itself reaches the disk with the directory (best effort: not every
    // platform can open a directory).
    if let Some(dir) = path.parent().and_then(|d| File::open(d).ok()) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// What [`end_on_a_whole_row`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Tail {
    /// The file is absent, empty, or ends in a whole row: unchanged.
    Whole,
    /// The last row was unfinished (a crash or a full disk while it was written, or a hand
    /// edit that dropped its newline): it was removed; here it is. `header`: it was the
    /// header, and the file is now empty.
    Removed { text: String, header: bool },
}

/// Makes `path` end in a whole CSV row before rows are appended to it. Every row attnbench
/// writes ends in a newline, outside quotes, and has the header's field count, so a last
/// row without either was not finished: it is cut off (a field cut short may still parse,
/// so a row is never kept on its looks). Rows are found by the CSV parser, so a quoted
/// field that holds newlines (an error message) is one row.
pub fn end_on_a_whole_row(path: &Path) -> Result<Tail> {
    let io = |e| Error::io(format!("cannot repair {}", path.display()), e);
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Tail::Whole),
        Err(e) => return Err(io(e)),
    };
    let mut reader = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_slice());
    let mut row = ::csv::ByteRecord::new();
    let (mut fields, mut last_start, mut last_fields, mut rows) = (0, 0, 0, 0);
    loop {
        let start = reader.position().byte();
        match reader.read_byte_record(&mut row) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                return Err(Error::Runtime(format!("reading {}: {e}", path.display())));
            }
        }
        if rows == 0 {
            fields = row.len();
        }
        (last_start, last_fields, rows) = (start, row.len(), rows + 1);
    }
    if rows == 0 || (text.ends_with(b"\n") && last_fields == fields) {
        return Ok(Tail::Whole);
    }
    let removed = String::from_utf8_lossy(&text[last_start as usize..]).into_owned();
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(last_start))
        .map_err(io)?;
    Ok(Tail::Removed {
        text: removed,
        header: rows == 1,
    })
}

/// Whether the file's first line (its header) is whole: it ends in a newline.
pub fn has_whole_first_line(path: &Path) -> bool {
    use std::io::BufRead;
    let mut line = Vec::new();
    File::open(path)
        .map(std::io::BufReader::new)
        .and_then(|mut r| r.read_until(b'\n', &mut line))
        .is_ok_and(|_| line.ends_with(b"\n"))
}

/// The exclusive right to write into a results directory, held until dropped: an advisory
/// lock on [`LOCK_NAME`] in it (a file, not the directory, so that network file systems
/// that lock files across hosts do so here too). Two sweeps writing one directory would
/// interleave their rows; the second is refused instead.
#[derive(Debug)]
pub struct DirLock {
    _file: Option<File>,
}

impl DirLock {
    /// Locks `dir` (which must exist). Where the file system cannot lock, the sweep goes on
    /// without the guard, with a warning: a missing lock must not stop a measurement.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        let path = dir.join(LOCK_NAME);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(format!("cannot create {}", path.display()), e))?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock { _file: Some(file) }),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::Usage(format!(
                "{} is being written by another attnbench sweep: wait for it to finish, or use \
                 another --out",
                dir.display()
            ))),
            Err(std::fs::TryLockError::Error(e)) => {
                eprintln!(
                    "warning: cannot lock {} ({e}): nothing stops a second sweep from writing \
                     into {} meanwhile",
                    path.display(),
                    dir.display()
                );
                Ok(DirLock { _file: None })
            }
        }
    }
}

/// Whether a sweep holds `dir`'s lock now (it is writing rows there). False where there is
/// no lock file or the file system cannot lock.
pub fn being_written(dir: &Path) -> bool {
    let Ok(file) = File::open(dir.join(LOCK_NAME)) else {
        return false;
    };
    matches!(
        file.try_lock_shared(),
        Err(std::fs::TryLockError::WouldBlock)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_says_the_directory_is_being_written() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(!being_written(tmp.path()), "no lock file");
        let lock = DirLock::acquire(tmp.path()).unwrap();
        assert!(being_written(tmp.path()));
        drop(lock);
        assert!(!being_written(tmp.path()), "released");
    }

    #[test]
    fn an_unfinished_last_row_is_cut_and_whole_files_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("t.csv");
        let check = |content: &str, want: Tail, after: &str| {
            std::fs::write(&p, content).unwrap();
            assert_eq!(end_on_a_whole_row(&p).unwrap(), want, "{content:?}");
            assert_eq!(std::fs::read_to_string(&p).unwrap(), after, "{content:?}");
        };
        let removed = |text: &str| Tail::Removed {
            text: text.into(),
            header: false,
        };
        check("name,n\na,1\n", Tail::Whole, "name,n\na,1\n");
        check("name,n\r\na,1\r\n", Tail::Whole, "name,n\r\na,1\r\n");
        check("", Tail::Whole, "");
        check("name,n\n", Tail::Whole, "name,n\n");
        // A field cut short may still parse ("1.25" -> "1.2"): without its newline the row
        // goes, whatever it looks like.
        check("name,n\na,1\nb,1.2", removed("b,1.2"), "name,n\na,1\n");
        check("name,n\na,1\nb,", removed("b,"), "name,n\na,1\n");
        // A row with too few fields that still ends in a newline (cut inside a quoted field
        // after one of its newlines).
        check(
            "name,n\na,1\n\"line 1\nline 2\n",
            removed("\"line 1\nline 2\n"),
            "name,n\na,1\n",
        );
        // A quoted field with newlines is one row: a whole one stays, an unfinished one goes
        // whole, not from its last newline.
        check("name,n\n\"x\ny\",1\n", Tail::Whole, "name,n\n\"x\ny\",1\n");
        check(
            "name,n\na,1\n\"x\ny\",",
            removed("\"x\ny\","),
            "name,n\na,1\n",
        );
        // A header cut short: the file is emptied (its sink writes the header again).
        check(
            "nam",
            Tail::Removed {
                text: "nam".into(),
                header: true,
            },
            "",
        );
        assert_eq!(
            end_on_a_whole_row(&tmp.path().join("absent.csv")).unwrap(),
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
        assert!(is_bookkeeping(".meta.json.123.tmp") && is_bookkeeping(LOCK_NAME));
        assert!(!is_bookkeeping("runs.csv") && !is_bookkeeping("x.tmp"));
    }

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
