//! The `attnbench` binary: parse, call the library, print `error: ...` and exit with the
//! error's code (2 usage/config, 1 runtime, 130 interrupted), or with the code a command
//! returns (`compare`: 3 regression, 4 unclear).
use clap::Parser;

fn main() {
    let cli = attnbench::cli::Cli::parse();
    // Under mpirun: MPI stays initialized until the command returns (finalized on drop).
    let session = match attnbench::dist::init_if_launched() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(e.exit_code());
        }
    };
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
