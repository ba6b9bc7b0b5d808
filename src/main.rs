//! The `attnbench` binary: parse, call the library, print `error: ...` and exit with the
//! error's code (2 usage/config, 1 runtime, 130 interrupted).
use clap::Parser;

fn main() {
    let cli = attnbench::cli::Cli::parse();
    if let Err(e) = attnbench::cli::dispatch(&cli) {
        eprintln!("error: {e}");
        std::process::exit(e.exit_code());
    }
}
