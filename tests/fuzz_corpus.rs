//! The malformed-input corpus (tests/fixtures/fuzz/corpus.toml, docs/internals/fuzz-corpus.md):
//! every entry runs the release binary in a temp dir of its own, and must end with its exit
//! code, no signal (abort, segfault), no panic, within the hang limit, and with a message
//! that names the key or flag. `FUZZ_CASE=SUBSTRING` runs only the entries whose name
//! holds it.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

/// A run past this is a hang: killed and failed (the whole corpus takes seconds).
const HANG_LIMIT: Duration = Duration::from_secs(30);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Corpus {
    /// Named directories of files (a good results directory) that entries copy in.
    #[serde(default)]
    fixture: BTreeMap<String, BTreeMap<String, String>>,
    case: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    args: Vec<String>,
    exit: i32,
    expect: String,
    /// Directory in the temp dir -> fixture copied into it, before `files` and `edit`.
    #[serde(default)]
    dirs: BTreeMap<String, String>,
    /// Path -> text written before the run.
    #[serde(default)]
    files: BTreeMap<String, String>,
    /// Path -> bytes as hex (non-UTF-8 text, .npy inputs).
    #[serde(default)]
    hex_files: BTreeMap<String, String>,
    /// One CSV field set in a file already there (row 1 is the first data row).
    #[serde(default)]
    edit: Vec<Edit>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Edit {
    file: String,
    row: usize,
    column: String,
    value: String,
}

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Sets `column` of data row `row` (plain CSV: the fixtures hold no quoted fields).
fn edit_csv(path: &Path, e: &Edit) {
    let text = fs::read_to_string(path).unwrap();
    let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
    let col = lines[0]
        .split(',')
        .position(|c| c == e.column)
        .unwrap_or_else(|| panic!("{}: no column {}", e.file, e.column));
    let mut fields: Vec<&str> = lines[e.row].split(',').collect();
    fields[col] = &e.value;
    lines[e.row] = fields.join(",");
    fs::write(path, lines.join("\n")).unwrap();
}

/// Runs one entry; `Err` says what went wrong.
fn run(corpus: &Corpus, e: &Entry) -> Result<(), String> {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    for (dir, fixture) in &e.dirs {
        let files = corpus
            .fixture
            .get(fixture)
            .ok_or_else(|| format!("no fixture {fixture}"))?;
        for (name, text) in files {
            write(&root.join(dir).join(name), text.as_bytes());
        }
    }
    for (name, text) in &e.files {
        write(&root.join(name), text.as_bytes());
    }
    for (name, hex) in &e.hex_files {
        write(&root.join(name), &unhex(hex));
    }
    for ed in &e.edit {
        edit_csv(&root.join(&ed.file), ed);
    }
    // Output goes to files, so a chatty child never blocks on a full pipe.
    let out_path = root.join(".stdout");
    let err_path = root.join(".stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_attnbench"))
        .args(&e.args)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > HANG_LIMIT {
            child.kill().ok();
            child.wait().ok();
            return Err(format!("hang: killed after {HANG_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = String::from_utf8_lossy(&fs::read(&out_path).unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&fs::read(&err_path).unwrap()).into_owned();
    let tail = |s: &str| {
        s.chars()
            .rev()
            .take(400)
            .collect::<String>()
            .chars()
            .rev()
            .collect::<String>()
    };
    if let Some(sig) = status.signal() {
        return Err(format!("killed by signal {sig}: {}", tail(&stderr)));
    }
    if stderr.contains("panicked") {
        return Err(format!("panicked: {}", tail(&stderr)));
    }
    let code = status.code().unwrap();
    if code != e.exit {
        return Err(format!(
            "exit {code}, expected {}: {}",
            e.exit,
            tail(if stderr.is_empty() { &stdout } else { &stderr })
        ));
    }
    // A refusal names the key on stderr; a run that goes through may say it on either.
    let said = if e.exit == 0 {
        format!("{stdout}{stderr}")
    } else {
        stderr.clone()
    };
    if !said.contains(&e.expect) {
        return Err(format!(
            "the message does not name `{}`: {}",
            e.expect,
            tail(&said)
        ));
    }
    Ok(())
}

#[test]
fn every_bad_input_is_refused_cleanly() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz/corpus.toml");
    let corpus: Corpus = toml::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    let mut names = HashSet::new();
    for e in &corpus.case {
        assert!(
            names.insert(e.name.as_str()),
            "entry {} appears twice",
            e.name
        );
        // A refusal must say what it refuses: an entry without the key would check nothing.
        assert!(
            e.exit == 0 || !e.expect.is_empty(),
            "{}: a refusal needs `expect`",
            e.name
        );
    }
    let filter = std::env::var("FUZZ_CASE").unwrap_or_default();
    let cases: Vec<&Entry> = corpus
        .case
        .iter()
        .filter(|e| e.name.contains(&filter))
        .collect();
    assert!(!cases.is_empty(), "no entry matches FUZZ_CASE={filter}");

    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(e) = cases.get(i) else { break };
                if let Err(why) = run(&corpus, e) {
                    failures.lock().unwrap().push(format!("{}: {why}", e.name));
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    println!(
        "fuzz corpus: {} entries, {} passed, {} failed, in {:.1} s",
        cases.len(),
        cases.len() - failures.len(),
        failures.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} entries failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
