//! The `attnbench` binary: parse, call the library, print `error: ...` and exit with the
//! error's code (2 usage/config, 1 runtime, 130 interrupted), or with the code a command
//! returns (`compare`: 3 regression, 4 unclear).
use clap::Parser;

fn main() {
    let cli = attnbench::cli::Cli::parse();
    match attnbench::cli::dispatch(&cli) {
        Ok(0) => {}
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(e.exit_code());
        }
    }
}
