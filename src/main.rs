//! The `attnbench` binary: parse, call the library, print `error: ...` and exit with the
//! error's code (2 usage/config, 1 runtime, 130 interrupted), or with the code a command
//! returns (`compare`: 3 regression, 4 unclear).

fn main() {
    let cli = attnbench::cli::parse();
    // Under mpirun: MPI stays initialized until the command returns (finalized on drop).
    let session = match attnbench::dist::init_if_launched() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(e.exit_code());
        }
    };
    if attnbench::dist::size() <= 1 {
        restore_sigpipe();
    }
    let result = attnbench::cli::dispatch(&cli);
    if let Err(e) = &result {
        eprintln!("error: {e}");
        // Under mpirun a failing rank ends all of them (before finalizing, which would wait
        // for ranks that may be waiting for this one inside a collective).
        if attnbench::dist::size() > 1 {
            eprintln!(
                "error: rank {} of {} failed; aborting all ranks",
                attnbench::dist::rank(),
                attnbench::dist::size()
            );
            attnbench::dist::abort_all(e.exit_code());
        }
    }
    attnbench::dist::finish(session);
    match result {
        Ok(0) => {}
        Ok(code) => std::process::exit(code),
        Err(e) => std::process::exit(e.exit_code()),
    }
}

/// Output piped into a reader that stops early (`attnbench list | head`) ends the process
/// quietly, as for other command-line tools, instead of a panic on the failed print: the
/// Rust runtime ignores SIGPIPE, this restores the default. Not under mpirun, whose
/// transports may see broken connections as errors to handle.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to the default has no preconditions; no other
    // thread has started yet.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
